// What tying, freezing or removing W_q, W_k, W_v breaks, on every task, with the embeddings
// learned or frozen.
#include "qkv/experiments/experiment.hpp"

namespace qkv::experiments {

using namespace tasks;
using namespace training;

ExperimentSpec ablations_experiment() {
  return {.name = "ablations",
          .description = "brackets, rps, induction × projections untied | tied | identity | frozen × embeddings "
                         "learned | frozen",
          .plan = [](const ExperimentOptions& e) {
            std::vector<ExperimentConfig> out;
            for (const std::string task : {"brackets", "rps", "induction"})
              for (const std::string variant : {"untied", "tied", "identity", "frozen"})
                for (const std::string embeddings : {"learned", "frozen"}) {
                  TrainOptions o = experiment_run(task, e);
                  set_variant(o, variant);
                  o.model.frozen_embeddings = embeddings == "frozen";
                  out.push_back({{{"task", task}, {"variant", variant}, {"embeddings", embeddings}}, o});
                }
            return out;
          }};
}

}  // namespace qkv::experiments
