// RelationTask: the items and probes of the `line` and `cycle` tasks (line.cpp, cycle.cpp).
#include <algorithm>
#include <cmath>
#include <sstream>

#include <xtensor/xview.hpp>

#include "qkv/nn/circuits.hpp"
#include "qkv/tasks/builtin.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/core/autograd.hpp"
#include "qkv/core/ops.hpp"

namespace qkv::tasks {

RelationTask::RelationTask(std::size_t n, bool cyclic) : n_(n), cyclic_(cyclic) {
  if (n < 3 || n > 64) fail(cyclic ? "cycle" : "line", "n must be in [3, 64], got {}", n);
  info_ = {.name = cyclic ? "cycle" : "line",
           .description = cyclic ? fmt::format("0-{} shuffled: point each value v at v + 1 mod {} (a cycle)", n - 1, n)
                                 : fmt::format("0-{} shuffled: point each value v at v + 1 (a line; {} points nowhere)",
                                               n - 1, n - 1),
           .vocab_size = n, .n_classes = 0, .max_len = n, .readout = nn::Readout::pointer, .causal = false};
}

std::optional<std::int64_t> RelationTask::next(std::int64_t v) const {
  const auto n = std::int64_t(n_);
  if (v + 1 < n) return v + 1;
  if (cyclic_) return 0;
  return std::nullopt;
}

Batch RelationTask::sample(std::size_t batch_size, Generator& gen) const {
  Batch batch{filled(batch_size, n_, 0), filled(batch_size, n_, ignore_target)};
  std::vector<std::int64_t> row(n_);
  for (std::size_t b = 0; b < batch_size; ++b) {
    for (std::size_t t = 0; t < n_; ++t) row[t] = std::int64_t(t);
    for (std::size_t t = n_; t-- > 1;) std::swap(row[t], row[gen.next_u64() % (t + 1)]);
    const auto targets = *pointer_targets(row);
    for (std::size_t t = 0; t < n_; ++t) {
      batch.tokens(b, t) = row[t];
      batch.targets(b, t) = targets[t];
    }
  }
  return batch;
}

std::optional<std::vector<std::int64_t>> RelationTask::pointer_targets(const std::vector<std::int64_t>& tokens) const {
  std::vector<std::int64_t> where(n_, -1), targets(tokens.size(), ignore_target);
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    if (tokens[t] < 0 || tokens[t] >= std::int64_t(n_) || where[std::size_t(tokens[t])] >= 0) return std::nullopt;
    where[std::size_t(tokens[t])] = std::int64_t(t);
  }
  for (std::size_t t = 0; t < tokens.size(); ++t)
    if (const auto v = next(tokens[t]); v && where[std::size_t(*v)] >= 0) targets[t] = where[std::size_t(*v)];
  return targets;
}

std::string RelationTask::decode(const std::vector<std::int64_t>& tokens) const { return numbers_text(tokens); }

std::vector<std::int64_t> RelationTask::encode(const std::string& text) const {
  return parse_numbers(text, n_, info_.name);
}

std::string RelationTask::token_name(std::int64_t token) const { return std::to_string(token); }

Probe RelationTask::probe(const nn::Transformer& model, std::uint64_t seed) const {
  NoGradGuard no_grad;
  Generator gen(seed ^ 0x7e1a710eULL);
  const Batch batch = sample(256, gen);
  const Array<double> s = model.forward(batch.tokens).logits.to(DType::float64).value<double>();  // (B, T, T)
  const std::size_t B = batch.tokens.shape()[0], T = n_;
  double top = 0, pairs_right = 0, pairs = 0, queries = 0, best_sequence = 0;
  for (std::size_t b = 0; b < B; ++b) {
    double right = 0, scored = 0;
    for (std::size_t i = 0; i < T; ++i) {
      const std::int64_t target = batch.targets(b, i);
      if (target < 0) continue;
      ++scored;
      bool first = true;
      for (std::size_t j = 0; j < T; ++j) {
        if (j == std::size_t(target)) continue;
        const bool above = s(b, i, std::size_t(target)) > s(b, i, j);
        pairs_right += above;
        first = first && above;
        ++pairs;
      }
      right += first;
    }
    top += right;
    queries += scored;
    best_sequence = std::max(best_sequence, right / scored);
  }
  Probe p{.values = {{"top1", top / queries}, {"top1_max", best_sequence}, {"pairwise", pairs_right / pairs}},
          .violations = {}};

  // The readout head's token table.
  const Array<double> table =
      xt::view(nn::table_scores(*model.blocks.back(), model.tok.weight).to(DType::float64).value<double>(), 0, 0);
  double dot = 0, table_norm = 0, relation_norm = 0;
  for (std::size_t a = 0; a < n_; ++a)
    for (std::size_t b = 0; b < n_; ++b) {
      const double k = (table(a, b) - table(b, a)) / 2;
      const auto to = next(std::int64_t(a)), from = next(std::int64_t(b));
      const double r = double(to && *to == std::int64_t(b)) - double(from && *from == std::int64_t(a));
      dot += k * r;
      table_norm += k * k;
      relation_norm += r * r;
    }
  p.values.emplace_back("alignment", table_norm > 0 ? dot / std::sqrt(table_norm * relation_norm) : 0.0);

  if (cyclic_ && nn::symmetric_scores(model.config()) && best_sequence > 1 - 0.5 / double(n_))
    p.violations.push_back(fmt::format("a symmetric score put every successor of a {}-cycle on top in a sequence, "
                                       "which it cannot: a bug", n_));
  return p;
}

TaskSpec RelationTask::spec(bool cyclic) {
  std::vector<std::size_t> sizes{3, 5, 7};  // a cycle's (rps's is 3); a line takes 3-16
  if (!cyclic) {
    sizes.clear();
    for (std::size_t n = 3; n <= 16; ++n) sizes.push_back(n);
  }
  std::vector<Column> columns = {{"top1", "top-1", "{:.3f}"}, {"pairwise", "pairwise", "{:.3f}"},
                                 {"alignment", "alignment", "{:.3f}"}};
  if (cyclic) columns.insert(columns.begin() + 1, {"top1_max", "top-1, best sequence", "{:.3f}"});
  return {.name = cyclic ? "cycle" : "line",
          .make = [cyclic](std::size_t n) { return std::make_unique<RelationTask>(n, cyclic); },
          .sizes = sizes,
          .default_size = cyclic ? std::size_t(5) : std::size_t(8),
          .defaults =
              [](TrainOptions& o) {
                o.model.layers = 1;
                o.model.heads = 1;
                o.steps = 1000;
              },
          .target = 0.99,
          .target_name = "successor",
          .probe = [cyclic](const nn::Transformer& model, std::uint64_t seed) {
            return RelationTask(model.config().vocab_size, cyclic).probe(model, seed);
          },
          .probe_columns = columns};
}

}  // namespace qkv::tasks
