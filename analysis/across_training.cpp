#include "qkv/analysis/across_training.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include <xtensor/xview.hpp>

#include "qkv/analysis/detail/tally.hpp"
#include "qkv/analysis/logit_attribution.hpp"
#include "qkv/analysis/patching.hpp"
#include "qkv/core/autograd.hpp"
#include "qkv/nn/circuits.hpp"
#include "qkv/tasks/evaluate.hpp"

namespace qkv::analysis {

std::vector<std::vector<double>> prefix_matching(const nn::Transformer& model, std::size_t sequences, std::uint64_t seed) {
  const std::size_t n = model.config().max_len / 2, V = model.config().vocab_size, L = model.blocks.size();
  std::vector<std::vector<double>> scores(L, std::vector<double>(model.config().heads, 0.0));
  if (n < 2) return scores;
  Generator gen = tasks::held_out_generator(seed);
  IndexArray tokens = tasks::filled(sequences, 2 * n, 0);
  for (std::size_t b = 0; b < sequences; ++b)
    for (std::size_t t = 0; t < n; ++t) tokens(b, t) = tokens(b, t + n) = std::int64_t(gen.next_u64() % V);
  NoGradGuard no_grad;
  const nn::TransformerOutput out = model.forward(tokens, true);
  for (std::size_t l = 0; l < L; ++l) {
    const Array<double> w = out.attention[l].weights.to(DType::float64).value<double>();  // (B, H, T, T)
    for (std::size_t h = 0; h < scores[l].size(); ++h) {
      double sum = 0;
      for (std::size_t b = 0; b < sequences; ++b)
        for (std::size_t t = n; t < 2 * n; ++t) sum += w(b, h, t, t - n + 1);
      scores[l][h] = sum / double(sequences * n);
    }
  }
  return scores;
}

std::optional<InContext> in_context(const nn::Transformer& model, const nn::TransformerOutput& out, const tasks::Batch& batch,
                                    std::optional<std::int64_t> pad) {
  const nn::TransformerConfig& c = model.config();
  const std::size_t B = batch.tokens.shape()[0], T = batch.tokens.shape()[1];
  if (c.readout != nn::Readout::token || c.n_classes != c.vocab_size || T < 8) return std::nullopt;
  for (std::size_t l = 0; l < model.blocks.size(); ++l)
    if (!model.causal(l)) return std::nullopt;
  const Array<double> logits = out.logits.to(DType::float64).value<double>();
  const std::size_t C = logits.shape()[2], quarter = T / 4;
  // The cross-entropy of the next token at position t, averaged over the sequences whose next token
  // is not padding (NaN where none is).
  const auto next_token_loss = [&](std::size_t t) {
    double sum = 0;
    std::size_t n = 0;
    for (std::size_t b = 0; b < B; ++b) {
      if (pad && batch.tokens(b, t + 1) == *pad) continue;
      ++n;
      double top = -INFINITY;
      for (std::size_t k = 0; k < C; ++k) top = std::max(top, logits(b, t, k));
      double z = 0;
      for (std::size_t k = 0; k < C; ++k) z += std::exp(logits(b, t, k) - top);
      sum += top + std::log(z) - logits(b, t, std::size_t(batch.tokens(b, t + 1)));
    }
    return n ? sum / double(n) : NAN;
  };
  double early = 0, late = 0;
  for (std::size_t t = 0; t < quarter; ++t) early += next_token_loss(t) / double(quarter);
  for (std::size_t t = T - 1 - quarter; t < T - 1; ++t) late += next_token_loss(t) / double(quarter);
  return InContext{early, late};
}

std::optional<std::size_t> half_way_step(const std::vector<std::pair<std::size_t, double>>& values) {
  if (values.size() < 2) return std::nullopt;
  const double first = values.front().second, last = values.back().second;
  if (!std::isfinite(first) || !std::isfinite(last) || first == last) return std::nullopt;
  const double half = (first + last) / 2;
  // From the last value back, while each is past half-way: a measure that rose and fell back
  // before it rose for good formed when it rose for good.
  std::size_t i = values.size() - 1;
  while (i > 0 && (last > first ? values[i - 1].second >= half : values[i - 1].second <= half)) --i;
  return values[i].first;
}

Formation formation(const AcrossTraining& a) {
  Formation f;
  if (a.checkpoints.empty()) return f;
  const auto series = [&](const auto& value) {
    std::vector<std::pair<std::size_t, double>> s;
    for (const CheckpointMeasures& c : a.checkpoints) s.emplace_back(c.step, value(c));
    return s;
  };
  f.loss = half_way_step(series([](const CheckpointMeasures& c) { return c.loss; }));
  if (a.checkpoints.back().in_context)
    f.in_context = half_way_step(series([](const CheckpointMeasures& c) { return c.in_context ? c.in_context->score() : NAN; }));
  const CheckpointMeasures& last = a.checkpoints.back();
  for (std::size_t l = 0; l < last.heads.size(); ++l)
    for (std::size_t h = 0; h < last.heads[l].size(); ++h) {
      Formation::Head head{.layer = l, .head = h, .role = HeadKind::previous_token, .score = 0, .step = std::nullopt};
      for (const HeadKind kind : all_head_kinds)
        if (const double s = last.heads[l][h].detection.score(kind); s > head.score) head.role = kind, head.score = s;
      head.step = half_way_step(series([&](const CheckpointMeasures& c) { return c.heads[l][h].detection.score(head.role); }));
      f.heads.push_back(head);
    }
  for (std::size_t i = 0; i < last.composition.size(); ++i) {
    const HeadComposition& x = last.composition[i];
    f.composition.push_back({x.from_layer, x.from_head, x.to_layer, x.to_head,
                             half_way_step(series([&](const CheckpointMeasures& c) { return c.composition[i].k; }))});
  }
  std::vector<HeadDetection> detected;
  for (const auto& layer : last.heads)
    for (const HeadMeasures& h : layer) detected.push_back(h.detection);
  if (detected.empty()) return f;
  Formation::Circuit& c = f.circuit;
  c.previous_token = best_head(detected, HeadKind::previous_token);
  c.induction = best_head(detected, HeadKind::induction);
  const auto score_step = [&](const HeadDetection& d, HeadKind kind) {
    return half_way_step(series([&](const CheckpointMeasures& m) { return m.heads[d.layer][d.head].detection.score(kind); }));
  };
  c.previous_token_step = score_step(c.previous_token, HeadKind::previous_token);
  c.induction_step = score_step(c.induction, HeadKind::induction);
  for (const Formation::Pair& p : f.composition)
    if (p.from_layer == c.previous_token.layer && p.from_head == c.previous_token.head && p.to_layer == c.induction.layer &&
        p.to_head == c.induction.head)
      c.k_composition_step = p.step;
  if (c.previous_token_step && c.induction_step && c.k_composition_step) {
    const std::size_t lo = std::min({*c.previous_token_step, *c.induction_step, *c.k_composition_step}),
                      hi = std::max({*c.previous_token_step, *c.induction_step, *c.k_composition_step});
    c.together = std::none_of(a.checkpoints.begin(), a.checkpoints.end(),
                              [&](const CheckpointMeasures& m) { return m.step > lo && m.step < hi; });
    if (f.loss) c.before_loss = hi <= *f.loss;
  }
  return f;
}

CheckpointMeasures measure_checkpoint(nn::Transformer& model, const tasks::Task& task,
                                      const std::optional<tasks::Corruption>& corruption, std::size_t step,
                                      const MeasureOptions& o) {
  CheckpointMeasures m;
  m.step = step;
  const HeldOutBatch held = held_out_batch(model, task, o.sequences, o.seed, o.mask_padding, "across training");
  {
    // One forward for the loss, the accuracy and the in-context score.
    NoGradGuard no_grad;
    const nn::TransformerOutput out = model.forward(held.batch.tokens, false, held.mask);
    detail::Tally tally;
    tally.add(model, out, held.batch);
    m.loss = tally.loss();
    m.accuracy = tally.accuracy();
    m.in_context = in_context(model, out, held.batch, task.info().pad);
  }
  // A task that draws no sequences (a run's own) has none for the detectors: their scores stay 0.
  const auto sequences = detection_sequences(model, task);
  const std::vector<HeadDetection> detected = sequences.empty() ? std::vector<HeadDetection>{} : detect_heads(model, sequences);
  const auto prefix = prefix_matching(model);
  std::optional<Patching> patched;
  if (corruption)
    patched = patch(model, task, *corruption,
                    {.component = PatchComponent::z, .noising = true, .sequences = o.sequences, .seed = o.seed,
                     .mask_padding = o.mask_padding});
  std::optional<LogitAttribution> direct;
  if (model.config().readout == nn::Readout::token)
    direct = logit_attribution(model, task, {.sequences = o.sequences, .seed = o.seed, .mask_padding = o.mask_padding});
  const std::size_t H = model.config().heads;
  for (std::size_t l = 0; l < model.blocks.size(); ++l) {
    m.heads.emplace_back();
    for (std::size_t h = 0; h < H; ++h) {
      HeadMeasures& hm = m.heads.back().emplace_back();
      hm.sigma = nn::symmetric_share(nn::qk_circuit(model.blocks[l]->attn, h));
      if (!detected.empty()) hm.detection = detected[l * H + h];
      hm.detection.layer = l, hm.detection.head = h;
      hm.prefix_matching = prefix[l][h];
      if (patched) hm.noising_share = patched->loss_share(l, h, 0);
      if (direct) hm.logit_attribution = direct->heads[l][h];
    }
  }
  m.composition = compositions(model);
  return m;
}

}  // namespace qkv::analysis
