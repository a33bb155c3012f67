#include "qkv/analysis/heads.hpp"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "qkv/analysis/inspect.hpp"
#include "qkv/core/autograd.hpp"
#include "qkv/tasks/evaluate.hpp"
#include "qkv/tasks/task.hpp"

namespace qkv::analysis {

const char* name_of(HeadKind kind) {
  switch (kind) {
    case HeadKind::previous_token: return "previous_token";
    case HeadKind::duplicate_token: return "duplicate_token";
    case HeadKind::induction: return "induction";
  }
  throw std::logic_error("name_of: no such head kind");
}

Array<double> detection_pattern(HeadKind kind, const std::vector<std::int64_t>& tokens) {
  const std::size_t T = tokens.size();
  Array<double> p = xt::zeros<double>({T, T});
  for (std::size_t i = 0; i < T; ++i)
    for (std::size_t j = 0; j <= i; ++j) {
      bool on = false;
      switch (kind) {
        case HeadKind::previous_token: on = j + 1 == i; break;
        case HeadKind::duplicate_token: on = j < i && tokens[j] == tokens[i]; break;
        case HeadKind::induction: on = j >= 1 && tokens[j - 1] == tokens[i]; break;
      }
      p(i, j) = on ? 1.0 : 0.0;
    }
  return p;
}

double detection_score(const Array<double>& weights, const Array<double>& pattern) {
  if (weights.dimension() != 2 || weights.shape()[0] != weights.shape()[1] || pattern.shape() != weights.shape())
    throw std::invalid_argument(fmt::format("detection_score: weights {} and pattern {} must be the same square matrix",
                                            fmt::join(weights.shape(), "×"), fmt::join(pattern.shape(), "×")));
  double on = 0, total = 0;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const double w = weights.data()[i];
    if (std::isnan(w)) continue;
    on += w * pattern.data()[i];
    total += w;
  }
  if (!(total > 0)) throw std::invalid_argument("detection_score: the weights hold no attention");
  return on / total;
}

double HeadDetection::score(HeadKind kind) const {
  switch (kind) {
    case HeadKind::previous_token: return previous_token;
    case HeadKind::duplicate_token: return duplicate_token;
    case HeadKind::induction: return induction;
  }
  throw std::logic_error("HeadDetection::score: no such kind");
}

std::vector<HeadDetection> detect_heads(const nn::Transformer& model, const std::vector<std::vector<std::int64_t>>& sequences) {
  const nn::TransformerConfig& c = model.config();
  if (sequences.empty()) throw std::invalid_argument("detect_heads: no sequences");
  std::vector<HeadDetection> out;
  for (std::size_t l = 0; l < c.layers; ++l)
    for (std::size_t h = 0; h < c.heads; ++h) out.push_back({.layer = l, .head = h});
  NoGradGuard no_grad;
  for (std::size_t s = 0; s < sequences.size(); ++s) {
    const std::vector<std::int64_t>& tokens = sequences[s];
    if (tokens.size() < 2 || tokens.size() > c.max_len)
      throw std::invalid_argument(fmt::format("detect_heads: sequence {} holds {} tokens; it needs 2 to the model's {}", s,
                                              tokens.size(), c.max_len));
    for (std::int64_t t : tokens)
      if (t < 0 || std::size_t(t) >= c.vocab_size)
        throw std::invalid_argument(
            fmt::format("detect_heads: sequence {} holds token {}, outside the vocabulary of {}", s, t, c.vocab_size));
    std::vector<Array<double>> patterns;
    for (HeadKind kind : all_head_kinds) patterns.push_back(detection_pattern(kind, tokens));
    const nn::TransformerOutput f = model.forward(tasks::one_row(tokens), true);
    for (HeadDetection& d : out) {
      const Array<double> w = head_matrix(f.attention[d.layer].weights, d.head);
      d.previous_token += detection_score(w, patterns[0]);
      d.duplicate_token += detection_score(w, patterns[1]);
      d.induction += detection_score(w, patterns[2]);
    }
  }
  for (HeadDetection& d : out) {
    d.previous_token /= double(sequences.size());
    d.duplicate_token /= double(sequences.size());
    d.induction /= double(sequences.size());
  }
  return out;
}

const HeadDetection& best_head(const std::vector<HeadDetection>& found, HeadKind kind) {
  if (found.empty()) throw std::invalid_argument("best_head: no heads");
  return *std::max_element(found.begin(), found.end(), [&](const auto& a, const auto& b) { return a.score(kind) < b.score(kind); });
}

std::vector<std::vector<std::int64_t>> detection_sequences(const nn::Transformer& model, const tasks::Task& task,
                                                           std::size_t count) {
  if (!task.info().draws) return {};
  std::vector<std::vector<std::int64_t>> sequences = tasks::held_out_sequences(task, count, 0);
  std::erase_if(sequences, [&](const std::vector<std::int64_t>& s) { return s.size() < 2 || s.size() > model.config().max_len; });
  return sequences;
}

}  // namespace qkv::analysis
