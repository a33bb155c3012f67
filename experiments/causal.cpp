// Brackets with the causal mask and without it, tied and untied.
#include "qkv/experiments/experiment.hpp"

namespace qkv::experiments {

using namespace tasks;
using namespace training;

ExperimentSpec causal_experiment() {
  return {.name = "causal",
          .description = "brackets with causal and bidirectional attention, tied and untied",
          .plan = [](const ExperimentOptions& e) {
            std::vector<ExperimentConfig> out;
            for (const bool causal : {true, false})
              for (const std::string variant : {"untied", "tied"}) {
                TrainOptions o = experiment_run("brackets", e);
                o.model.causal = causal;
                set_variant(o, variant);
                out.push_back(
                    {{{"task", "brackets"}, {"attention", causal ? "causal" : "bidirectional"}, {"variant", variant}}, o});
              }
            return out;
          }};
}

}  // namespace qkv::experiments
