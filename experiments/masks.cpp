// Which layer's mask gives brackets its direction: causal or bidirectional attention per layer
// (layer 0 counts depth; layer 1 reads out), with W_q and W_k untied and tied. Bidirectional
// layers mask the padding keys.
#include "qkv/experiments/experiment.hpp"

namespace qkv::experiments {

using namespace tasks;
using namespace training;

ExperimentSpec masks_experiment() {
  return {.name = "masks",
          .description = "brackets with causal or bidirectional attention per layer (2 layers), untied and tied",
          .plan = [](const ExperimentOptions& e) {
            std::vector<ExperimentConfig> out;
            const auto name = [](bool causal) { return causal ? "causal" : "bidirectional"; };
            for (const bool first : {true, false})
              for (const bool readout : {true, false})
                for (const std::string variant : {"untied", "tied"}) {
                  TrainOptions o = experiment_run("brackets", e);
                  o.model.causal_layers = {first, readout};
                  set_variant(o, variant);
                  out.push_back({{{"task", "brackets"}, {"layer 0", name(first)}, {"layer 1 (readout)", name(readout)},
                                  {"variant", variant}},
                                 o});
                }
            return out;
          }};
}

}  // namespace qkv::experiments
