#include "qkv/analysis/inspect.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <ostream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <xtensor/xview.hpp>

#include "qkv/core/autograd.hpp"
#include "qkv/core/ops.hpp"
#include "qkv/nn/files.hpp"
#include "qkv/nn/safetensors.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/tasks/evaluate.hpp"

namespace qkv::analysis {

using namespace tasks;

Array<double> head_matrix(const Tensor& t, std::size_t h) {
  const Array<double> all = t.to(DType::float64).value<double>();
  return xt::view(all, 0, h);
}

Array<double> masked_weights(const Array<double>& weights, const Array<double>& scores) {
  Array<double> w = weights;
  for (std::size_t i = 0; i < w.size(); ++i)
    if (!std::isfinite(scores.data()[i])) w.data()[i] = NAN;
  return w;
}

namespace {

double frobenius(const Tensor& t) {
  const Array<double> a = t.to(DType::float64).value<double>();
  double total = 0;
  for (double v : a) total += v * v;
  return std::sqrt(total);
}

}  // namespace

std::vector<std::int64_t> typical_input(const Task& task) {
  Generator gen(2024);
  const std::size_t want = (3 * task.info().max_len + 3) / 4;
  std::vector<std::int64_t> tokens;
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const Batch b = task.sample(1, gen);
    const std::vector<std::int64_t> row(b.tokens.begin(), b.tokens.end());
    tokens = task.encode(task.decode(row));  // drops padding
    if (tokens.size() >= want) break;
  }
  return tokens;
}

namespace {

// From a forward with need_weights: each layer's scores, −inf where its mask hides a key (so the
// pairs each query sees are those; a NaN of a diverged model stays in, and gives none).
std::vector<std::vector<std::optional<double>>> score_asymmetries(const nn::TransformerOutput& f) {
  std::vector<std::vector<std::optional<double>>> out;
  for (const nn::AttentionResult& r : f.attention) {
    out.emplace_back();
    for (std::size_t h = 0; h < r.scores.size(1); ++h) {
      const Array<double> s = head_matrix(r.scores, h);
      out.back().push_back(nn::softmax_invariant_asymmetry(s, xt::not_equal(s, -std::numeric_limits<double>::infinity())));
    }
  }
  return out;
}

}  // namespace

std::vector<std::vector<std::optional<double>>> score_asymmetries(const nn::Transformer& model,
                                                                  const std::vector<std::int64_t>& input) {
  NoGradGuard no_grad;
  return score_asymmetries(model.forward(one_row(input), true));
}

std::vector<HeadComposition> compositions(const nn::Transformer& model) {
  std::vector<HeadComposition> out;
  const std::size_t heads = model.config().heads;
  for (std::size_t l1 = 0; l1 < model.blocks.size(); ++l1)
    for (std::size_t h1 = 0; h1 < heads; ++h1)
      for (std::size_t l2 = l1 + 1; l2 < model.blocks.size(); ++l2)
        for (std::size_t h2 = 0; h2 < heads; ++h2) {
          const auto score = [&](nn::Composition kind) {
            return nn::composition_score(model.blocks[l1]->attn, h1, model.blocks[l2]->attn, h2, kind);
          };
          out.push_back({l1, h1, l2, h2, score(nn::Composition::q), score(nn::Composition::k), score(nn::Composition::v)});
        }
  return out;
}

StepAttention attention_at_step(const nn::Transformer& model, const std::vector<std::int64_t>& input, std::size_t step) {
  NoGradGuard no_grad;
  const nn::TransformerOutput f = model.forward(one_row(input), true);
  StepAttention s{.step = step, .attention = {}, .sigma = {}};
  for (std::size_t l = 0; l < model.blocks.size(); ++l) {
    s.attention.emplace_back();
    s.sigma.emplace_back();
    for (std::size_t h = 0; h < model.config().heads; ++h) {
      s.attention.back().push_back(masked_weights(head_matrix(f.attention[l].weights, h), head_matrix(f.attention[l].scores, h)));
      s.sigma.back().push_back(nn::symmetric_share(nn::qk_circuit(model.blocks[l]->attn, h)));
    }
  }
  return s;
}

Inspection inspect(const nn::Transformer& model, const Task& task, const std::vector<std::int64_t>& input, const std::string& dir) {
  const nn::TransformerConfig& c = model.config();
  if (input.empty()) fail("inspect", "the input holds no tokens");
  if (input.size() > c.max_len)
    fail("inspect", "the input holds {} tokens, but the model has {} positions", input.size(), c.max_len);
  for (std::int64_t t : input)
    if (t < 0 || std::size_t(t) >= c.vocab_size) fail("inspect", "token {} is outside the vocabulary of {}", t, c.vocab_size);
  // Every head keeps a token table (vocab² scores) and a position table (max_len²) in float64, and
  // a layer's are computed in the model's dtype first: refused before anything is allocated when
  // they would not fit in half the memory available.
  const double V = double(c.vocab_size), P = double(c.max_len), heads = double(c.heads);
  const double table_bytes = heads * (double(c.layers) * 8 * (V * V + P * P) + 8 * (V * V + P * P));
  if (table_bytes > nn::available_memory() / 2)
    fail("inspect", "the token and position tables of {} heads (a vocabulary of {}, {} positions) need {:.1f} GiB, more "
         "than half the {:.1f} GiB available", c.layers * c.heads, c.vocab_size, c.max_len, table_bytes / (1 << 30),
         nn::available_memory() / (1 << 30));

  NoGradGuard no_grad;
  Inspection r;
  r.task = task.info().name;
  r.dir = dir;
  r.config = c;
  for (std::size_t t = 0; t < c.vocab_size; ++t) r.vocabulary.push_back(task.token_name(std::int64_t(t)));
  r.input = input;
  for (std::int64_t t : input) r.input_names.push_back(task.token_name(t));

  const nn::TransformerOutput f = model.forward(one_row(input), true);
  const std::vector<std::vector<std::optional<double>>> asymmetry = score_asymmetries(f);
  // A pointer task's targets on the input: the weight each head puts on them.
  std::vector<std::int64_t> targets;
  // A task the registry does not know (a run's own) has no targets to show.
  const std::vector<std::string> known = task_names();
  if (task.info().readout == nn::Readout::pointer && std::find(known.begin(), known.end(), r.task) != known.end()) {
    r.target_name = task_spec(r.task).target_name;
    targets = task.pointer_targets(input).value_or(std::vector<std::int64_t>{});
  }
  for (std::size_t l = 0; l < model.blocks.size(); ++l) {
    const nn::TransformerBlock& b = *model.blocks[l];
    const Tensor tokens_only = nn::table_scores(b, model.tok.weight), positions_only = nn::table_scores(b, model.position_table());
    std::vector<HeadInspection> heads;
    for (std::size_t h = 0; h < c.heads; ++h) {
      HeadInspection hi;
      hi.layer = l;
      hi.head = h;
      for (const Tensor& w : {b.attn.W_q(h), b.attn.W_k(h), b.attn.W_v(h), b.attn.W_o(h)}) {
        hi.shapes.push_back(w.shape());
        hi.norms.push_back(frobenius(w));
      }
      hi.qk = nn::qk_circuit(b.attn, h);
      hi.sigma = nn::symmetric_share(hi.qk);
      hi.antisymmetry = nn::antisymmetry(hi.qk);
      hi.qk_spectrum = nn::spectrum(hi.qk);
      const std::size_t d_head = hi.shapes[0][1];
      if (hi.qk_spectrum.rank > d_head)  // A = W_q W_kᵀ cannot exceed rank d_head: a bug if it does
        throw std::logic_error(fmt::format("inspect: layer {} head {}: the QK circuit has rank {} > d_head {}", l, h,
                                           hi.qk_spectrum.rank, d_head));
      hi.ov = nn::ov_circuit(b.attn, h);
      hi.ov_spectrum = nn::spectrum(hi.ov);
      hi.token_qk = head_matrix(tokens_only, h);
      hi.position_qk = head_matrix(positions_only, h);
      hi.attention = head_matrix(f.attention[l].weights, h);
      hi.scores = head_matrix(f.attention[l].scores, h);
      hi.score_asymmetry = asymmetry[l][h];
      if (!targets.empty()) {
        double total = 0;
        std::size_t n = 0;
        for (std::size_t t = 0; t < targets.size(); ++t)
          if (targets[t] >= 0) {
            total += hi.attention(t, std::size_t(targets[t]));
            ++n;
          }
        if (n) hi.target_attention = total / double(n);
      }
      heads.push_back(std::move(hi));
    }
    r.layers.push_back(std::move(heads));
  }
  r.composition = compositions(model);
  // A task that draws no sequences: the input alone.
  r.detection_held_out = task.info().draws;
  std::vector<std::vector<std::int64_t>> sequences = detection_sequences(model, task, inspect_detection_sequences);
  if (!r.detection_held_out && input.size() >= 2) sequences = {input};
  if (!sequences.empty()) {
    r.detection_sequences = sequences.size();
    for (const HeadDetection& d : detect_heads(model, sequences)) r.layers[d.layer][d.head].detection = d;
  }
  return r;
}

}  // namespace qkv::analysis
