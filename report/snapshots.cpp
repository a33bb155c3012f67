#include "qkv/report/snapshots.hpp"

#include "qkv/analysis/inspect.hpp"
#include "qkv/report/inspect.hpp"
#include "qkv/tasks/evaluate.hpp"
#include "qkv/tasks/registry.hpp"

namespace qkv::report {

using namespace analysis;
using namespace tasks;

bool log_spaced(std::size_t step) {
  if (step < 10) return false;
  while (step % 10 == 0 && step >= 100) step /= 10;
  return step == 10 || step == 20 || step == 30 || step == 50;
}

Snapshots::Snapshots(const TrainOptions& options, const Task& task)
    : options_(options), task_(task), input_(typical_input(task)) {}

bool Snapshots::due(std::size_t step) const {
  const std::size_t every = options_.snapshot_every;
  return every > 0 && (step == 0 || step == options_.steps || step % every == 0 || (step < every && log_spaced(step)));
}

nlohmann::json Snapshots::take(std::size_t step, const nn::Transformer& model) const {
  const nlohmann::json in = to_json(inspect(model, task_, input_));
  nlohmann::json layers = nlohmann::json::array();
  const nlohmann::json& on_input = in.at("input");
  const std::string target = task_spec(options_.task).target_name + "_attention";
  for (std::size_t l = 0; l < in.at("layers").size(); ++l) {
    nlohmann::json heads = nlohmann::json::array();
    for (std::size_t h = 0; h < in.at("layers")[l].at("heads").size(); ++h) {
      const nlohmann::json& head = in.at("layers")[l].at("heads")[h];
      // The weights, null where the mask hides the key (where the score is null: −inf).
      nlohmann::json attention = on_input.at("attention")[l][h];
      const nlohmann::json& scores = on_input.at("scores")[l][h];
      for (std::size_t i = 0; i < attention.size(); ++i)
        for (std::size_t j = 0; j < attention[i].size(); ++j)
          if (scores[i][j].is_null()) attention[i][j] = nullptr;
      nlohmann::json s = {{"sigma", head.at("sigma")},
                          {"antisymmetry", head.at("antisymmetry")},
                          {"score_asymmetry", on_input.at("score_asymmetry")[l][h]},
                          {"qk_circuit", head.at("qk_circuit")},
                          {"attention", std::move(attention)}};
      if (on_input.contains(target)) s[target] = on_input.at(target)[l][h];
      heads.push_back(std::move(s));
    }
    layers.push_back({{"heads", std::move(heads)}});
  }
  nlohmann::json probes = nlohmann::json::object();
  if (const TaskSpec& spec = task_spec(options_.task); spec.probe)
    for (const auto& [key, value] : spec.probe(model, options_.seed).values) probes[key] = value;
  const TrainOptions& o = options_;
  return {{"step", step},
          {"accuracy", evaluate(model, task_, o.eval_batches, o.batch, o.seed, o.mask_padding).accuracy},
          {"input", input_},
          {"layers", std::move(layers)},
          {"composition", in.at("composition")},
          {"probes", std::move(probes)}};
}

}  // namespace qkv::report
