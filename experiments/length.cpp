// Lengths beyond training's: brackets trained on lengths up to 24, tested on 26-40 and 42-64, with
// learned positions (rows past 25 never trained) and fixed sinusoidal ones.
#include "qkv/experiments/experiment.hpp"
#include "qkv/tasks/evaluate.hpp"

namespace qkv::experiments {

using namespace tasks;
using namespace training;

ExperimentSpec length_experiment() {
  std::vector<Column> columns;
  for (const LongerLengths& l : task_spec("brackets").longer)
    columns.push_back({"accuracy_" + l.lengths, "accuracy " + l.lengths, "{:.3f}"});
  return {.name = "length",
          .description = "brackets trained on lengths 4-24, tested on 26-40 and 42-64; learned | sinusoidal positions",
          .plan =
              [](const ExperimentOptions& e) {
                std::vector<ExperimentConfig> out;
                for (const nn::Positions positions : nn::all_positions) {
                  TrainOptions o = experiment_run("brackets", e);
                  o.model.positions = positions;
                  o.model.max_len = task_spec("brackets").longer.back().make()->info().max_len;
                  out.push_back({{{"task", "brackets"}, {"positions", nn::name_of(positions)}}, o});
                }
                return out;
              },
          .columns = columns,
          .at_end = [](nlohmann::ordered_json& run, const nn::Transformer& trained, const Sequences&) {
            // 1,024 held-out sequences of each length range, from a stream of their own.
            for (const LongerLengths& l : task_spec("brackets").longer)
              run["accuracy_" + l.lengths] = evaluate(trained, *l.make(), 32, 32, 0x1e9).accuracy;
          }};
}

}  // namespace qkv::experiments
