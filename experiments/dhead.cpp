// How narrow a head can be: d_head 1 makes every score rank 1.
#include "qkv/experiments/experiment.hpp"

namespace qkv::experiments {

using namespace tasks;
using namespace training;

ExperimentSpec dhead_experiment() {
  return {.name = "dhead",
          .description = "d_head 1, 2, 4, 8 on rps and brackets",
          .plan = [](const ExperimentOptions& e) {
            std::vector<ExperimentConfig> out;
            for (const std::string task : {"rps", "brackets"})
              for (const std::size_t d : {1, 2, 4, 8}) {
                TrainOptions o = experiment_run(task, e);
                o.model.d_head = d;
                out.push_back({{{"task", task}, {"d_head", d}}, o});
              }
            return out;
          }};
}

}  // namespace qkv::experiments
