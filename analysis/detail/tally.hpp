#pragma once
// What ablation and patching score a forward by, summed over batches: accuracy and mean loss over
// the scored positions, and the mean logit difference (the target's logit minus the best other
// one) over those where another class has a finite logit.
#include <cmath>
#include <limits>

#include "qkv/nn/transformer.hpp"
#include "qkv/tasks/task.hpp"

namespace qkv::analysis::detail {

struct Tally {
  tasks::MetricsSum metrics;
  double loss_sum = 0, margin_sum = 0;
  std::size_t scored = 0, margins = 0;

  void add(const nn::Transformer& model, const nn::TransformerOutput& out, const tasks::Batch& batch, bool margin = false) {
    const tasks::Metrics m = tasks::score(nn::Transformer::predictions(out.logits), batch);
    if (m.scored > 0) loss_sum += model.loss(out, batch.targets).item() * double(m.scored);
    scored += m.scored;
    metrics.add(m);
    if (!margin) return;
    const Array<double> logits = out.logits.to(DType::float64).value<double>();
    const std::size_t B = logits.shape()[0], T = logits.shape()[1], C = logits.shape()[2];
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t t = 0; t < T; ++t) {
        const std::int64_t target = batch.targets(b, t);
        if (target < 0) continue;
        double other = -std::numeric_limits<double>::infinity();
        for (std::size_t c = 0; c < C; ++c)
          if (std::int64_t(c) != target) other = std::max(other, logits(b, t, c));
        if (!std::isfinite(other)) continue;
        margin_sum += logits(b, t, std::size_t(target)) - other;
        ++margins;
      }
  }
  double accuracy() const { return metrics.result().accuracy; }
  double loss() const { return scored ? loss_sum / double(scored) : 0; }
  double logit_diff() const { return margins ? margin_sum / double(margins) : 0; }
};

}  // namespace qkv::analysis::detail
