// What 1/√d_head does: without it, wide heads start with near one-hot attention and small gradients.
#include "qkv/experiments/experiment.hpp"

#include <cmath>

#include "qkv/core/autograd.hpp"
#include "qkv/tasks/evaluate.hpp"

namespace qkv::experiments {

using namespace tasks;
using namespace training;

namespace {

// At init: the mean entropy and the mean largest weight of every attention row, over all heads and
// layers; and ‖∂loss/∂W_q‖ over all layers, on one training batch.
void init_attention_stats(nlohmann::ordered_json& run, nn::Transformer& m, const Task& task, const Sequences& inputs,
                          std::uint64_t seed) {
  double entropy = 0, top = 0;
  std::size_t rows = 0;
  {
    NoGradGuard no_grad;
    for (const auto& input : inputs) {
      for (const auto& r : m.forward(one_row(input), true).attention) {
        const Array<double> w = r.weights.to(DType::float64).value<double>();  // (1, H, T, T)
        const std::size_t H = w.shape()[1], T = w.shape()[2];
        for (std::size_t h = 0; h < H; ++h)
          for (std::size_t i = 0; i < T; ++i) {
            double e = 0, best = 0;
            for (std::size_t j = 0; j < T; ++j) {
              const double p = w(0, h, i, j);
              if (p > 0) e -= p * std::log(p);
              best = std::max(best, p);
            }
            entropy += e;
            top += best;
            ++rows;
          }
      }
    }
  }
  Generator gen(seed);
  const Batch b = task.sample(32, gen);
  m.zero_grad();
  m.loss(m.forward(b.tokens, false, key_padding(m, task, b.tokens)), b.targets).backward();
  double grad = 0;
  for (const auto& block : m.blocks) {
    if (!block->attn.q_proj) continue;
    const Array<double> g = block->attn.q_proj->weight.grad().to(DType::float64).value<double>();
    for (double v : g) grad += v * v;
  }
  m.zero_grad();
  run["entropy_init"] = entropy / double(rows);
  run["max_weight_init"] = top / double(rows);
  run["grad_norm_init"] = std::sqrt(grad);
}

}  // namespace

ExperimentSpec scale_experiment() {
  return {.name = "scale",
          .description = "with and without 1/√d_head at d_head 4, 16, 64 (brackets)",
          .plan =
              [](const ExperimentOptions& e) {
                std::vector<ExperimentConfig> out;
                for (const std::size_t d : {4, 16, 64})
                  for (const bool scale : {true, false}) {
                    TrainOptions o = experiment_run("brackets", e);
                    o.model.d_head = d;
                    o.model.scale = scale;
                    out.push_back({{{"task", "brackets"}, {"d_head", d}, {"scale", scale ? "1/sqrt(d_head)" : "none"}}, o});
                  }
                return out;
              },
          .columns = {{"entropy_init", "entropy at init", "{:.3f}"},
                      {"max_weight_init", "max weight at init", "{:.3f}"},
                      {"grad_norm_init", "‖∂L/∂W_q‖ at init", "{:.3g}"}},
          .at_init = init_attention_stats};
}

}  // namespace qkv::experiments
