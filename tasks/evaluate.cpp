#include "qkv/tasks/evaluate.hpp"

#include <xtensor/xoperation.hpp>
#include <xtensor/xview.hpp>

#include "qkv/core/autograd.hpp"
#include "qkv/nn/generate.hpp"

namespace qkv::tasks {

namespace {

// Held-out sequences come from a generator no training batch uses.
constexpr std::uint64_t held_out_stream = 0x9e3779b97f4a7c15ULL;

}  // namespace

Generator held_out_generator(std::uint64_t seed) { return Generator(seed ^ held_out_stream); }

MaskArray key_padding(const nn::Transformer& model, const Task& task, const IndexArray& tokens, bool mask_padding) {
  if (!mask_padding) return MaskArray();
  const auto pad = task.info().pad;
  bool bidirectional = false;
  for (std::size_t l = 0; l < model.blocks.size(); ++l) bidirectional = bidirectional || !model.causal(l);
  if (!pad || !bidirectional) return MaskArray();
  return xt::not_equal(tokens, *pad);
}

std::vector<std::vector<std::int64_t>> held_out_sequences(const Task& task, std::size_t n, std::uint64_t seed) {
  Generator gen(seed ^ 0x5eedf00dULL);
  std::vector<std::vector<std::int64_t>> out;
  for (std::size_t i = 0; i < n; ++i) {
    const Batch b = task.sample_held_out(1, gen);
    out.push_back(task.encode(task.decode(std::vector<std::int64_t>(b.tokens.begin(), b.tokens.end()))));
  }
  return out;
}

MaskArray source_padding(const Task& task, const IndexArray& source) {
  return xt::not_equal(source, as_seq2seq(task)->sides().source_pad);
}

namespace {

// Whether a batch is scored at its last position alone (and somewhere): modadd's "a b =".
bool scored_last_only(const Batch& b) {
  const std::size_t B = b.targets.shape()[0], T = b.targets.shape()[1];
  bool any = false;
  for (std::size_t i = 0; i < B; ++i) {
    for (std::size_t t = 0; t + 1 < T; ++t)
      if (b.targets(i, t) != ignore_target) return false;
    any = any || b.targets(i, T - 1) != ignore_target;
  }
  return any;
}

}  // namespace

Forward forward(const nn::Transformer& model, const Task& task, const Batch& b, bool mask_padding, bool loss) {
  const MaskArray padding = key_padding(model, task, b.tokens, mask_padding);
  if (model.config().readout == nn::Readout::token && b.targets.dimension() == 2 && b.targets.shape()[1] > 1 &&
      scored_last_only(b)) {
    const nn::TransformerOutput f = model.forward_last(b.tokens, padding);
    const std::size_t B = b.targets.shape()[0], T = b.targets.shape()[1];
    const IndexArray last = xt::view(b.targets, xt::all(), xt::range(T - 1, T));
    IndexArray predictions = filled(B, T, -1);
    xt::view(predictions, xt::all(), xt::range(T - 1, T)) = nn::Transformer::predictions(f.logits);
    return {loss ? model.loss(f, last) : Tensor(), predictions};
  }
  const nn::TransformerOutput f = model.forward(b.tokens, false, padding);
  return {loss ? model.loss(f, b.targets) : Tensor(), nn::Transformer::predictions(f.logits)};
}

Forward forward(const nn::EncoderDecoder& model, const Task& task, const Batch& b, bool, bool loss) {
  const nn::EncoderDecoderOutput f = model.forward(b.source, b.tokens, false, source_padding(task, b.source));
  return {loss ? model.loss(f, b.targets) : Tensor(), nn::Transformer::predictions(f.logits)};
}

namespace {

template <class Model>
Metrics evaluate_model(const Model& model, const Task& task, std::size_t batches, std::size_t batch_size, std::uint64_t seed,
                       bool mask_padding) {
  if constexpr (std::is_same_v<Model, nn::Transformer>)
    if (const Split* split = task.split()) return score_rows(model, task, split->test, mask_padding).metrics;
  NoGradGuard no_grad;
  Generator gen = held_out_generator(seed);
  MetricsSum total;
  for (std::size_t i = 0; i < batches; ++i) {
    const Batch b = task.sample_held_out(batch_size, gen);
    total.add(score(forward(model, task, b, mask_padding, false).predictions, b));
  }
  return total.result();
}

}  // namespace

RowsScore score_rows(const nn::Transformer& model, const Task& task, const Batch& rows, bool mask_padding) {
  NoGradGuard no_grad;
  constexpr std::size_t chunk = 4096;
  const std::size_t n = rows.tokens.shape()[0];
  MetricsSum total;
  double loss = 0;
  std::size_t scored = 0;
  for (std::size_t begin = 0; begin < n; begin += chunk) {
    std::vector<std::size_t> part(std::min(chunk, n - begin));
    for (std::size_t i = 0; i < part.size(); ++i) part[i] = begin + i;
    const Batch b = part.size() == n ? rows : select_rows(rows, part);
    const Forward f = forward(model, task, b, mask_padding, true);
    const Metrics m = score(f.predictions, b);
    total.add(m);
    if (m.scored) loss += f.loss.item() * double(m.scored);
    scored += m.scored;
  }
  return {.metrics = total.result(), .loss = scored ? loss / double(scored) : 0};
}

Metrics evaluate(const nn::Transformer& model, const Task& task, std::size_t batches, std::size_t batch_size, std::uint64_t seed,
                 bool mask_padding) {
  return evaluate_model(model, task, batches, batch_size, seed, mask_padding);
}

Metrics evaluate(const nn::Transformer& model, const Task& task, const Dataset& data, bool mask_padding) {
  NoGradGuard no_grad;
  MetricsSum total;
  for (const Batch& b : data.batches) total.add(score(forward(model, task, b, mask_padding, false).predictions, b));
  return total.result();
}

Metrics evaluate(const nn::EncoderDecoder& model, const Task& task, std::size_t batches, std::size_t batch_size,
                 std::uint64_t seed, bool mask_padding) {
  return evaluate_model(model, task, batches, batch_size, seed, mask_padding);
}

Metrics evaluate_generation(const nn::EncoderDecoder& model, const Seq2SeqTask& task, std::size_t batches,
                            std::size_t batch_size, std::uint64_t seed) {
  NoGradGuard no_grad;
  Generator gen = held_out_generator(seed), unused(0);  // greedy decoding draws nothing
  MetricsSum total;
  for (std::size_t i = 0; i < batches; ++i) {
    const Batch b = task.sample_held_out(batch_size, gen);
    const IndexArray written = nn::generate(model, b.source, task.sides().start, b.targets.shape()[1], {}, unused, true,
                                            source_padding(task, b.source));
    total.add(score(written, b));
  }
  return total.result();
}

}  // namespace qkv::tasks
