// What a symmetric score can and cannot learn: untied, tied (a Gram matrix: symmetric and positive
// semi-definite), symmetric (k = q ⊙ s: symmetric, indefinite) and identity heads, on every task.
#include "qkv/experiments/experiment.hpp"

namespace qkv::experiments {

using namespace tasks;
using namespace training;

ExperimentSpec symmetry_experiment() {
  return {.name = "symmetry",
          .description = "untied | tied | symmetric | identity on brackets, rps, line, cycle (n 3, 5) and induction",
          .plan = [](const ExperimentOptions& e) {
            std::vector<ExperimentConfig> out;
            const std::pair<std::string, std::size_t> tasks[] = {
                {"brackets", 0}, {"rps", 0}, {"line", 0}, {"cycle", 3}, {"cycle", 5}, {"induction", 0}};
            for (const auto& [task, n] : tasks)
              for (const std::string variant : {"untied", "tied", "symmetric", "identity"}) {
                TrainOptions o = experiment_run(task, e, n);
                set_variant(o, variant);
                nlohmann::ordered_json labels = {{"task", n ? fmt::format("{} n={}", task, n) : task}, {"variant", variant}};
                out.push_back({labels, o});
              }
            return out;
          }};
}

}  // namespace qkv::experiments
