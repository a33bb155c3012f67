#include <algorithm>
#include <sstream>

#include "qkv/tasks/builtin.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/core/autograd.hpp"

namespace qkv::tasks {

namespace {
constexpr std::int64_t R = 0, P = 1, S = 2;
// The symbol that beats s: P beats R, S beats P, R beats S.
std::int64_t beater(std::int64_t s) { return s == R ? P : s == P ? S : R; }
}  // namespace

RpsTask::RpsTask(std::size_t min_len, std::size_t max_len) : min_len_(min_len), max_len_(max_len) {
  if (min_len < 3 || max_len < min_len)
    fail("rps", "lengths must satisfy 3 ≤ min_len ≤ max_len (got {}, {})", min_len, max_len);
  info_ = {.name = "rps",
           .description = fmt::format("cyclic retrieval, lengths {}-{}: fetch the payload of the symbol that beats yours",
                                      min_len, max_len),
           .vocab_size = std::size_t(3 * n_payloads), .n_classes = std::size_t(n_payloads), .max_len = max_len,
           .readout = nn::Readout::token, .causal = false};
}

Batch RpsTask::sample(std::size_t batch_size, Generator& gen) const {
  const std::size_t len = min_len_ + std::size_t(gen.next_u64() % (max_len_ - min_len_ + 1));
  Batch batch{filled(batch_size, len, 0), filled(batch_size, len, 0)};
  for (std::size_t b = 0; b < batch_size; ++b) {
    // Three different payloads for R, P, S.
    std::vector<std::int64_t> payloads(n_payloads);
    for (std::int64_t i = 0; i < n_payloads; ++i) payloads[std::size_t(i)] = i;
    for (std::size_t i = 0; i < 3; ++i) std::swap(payloads[i], payloads[i + gen.next_u64() % (n_payloads - i)]);
    // Every symbol at least once: the first three positions get R, P, S, the rest at random;
    // then a shuffle.
    std::vector<std::int64_t> symbols(len);
    for (std::size_t t = 0; t < len; ++t) symbols[t] = t < 3 ? std::int64_t(t) : std::int64_t(gen.next_u64() % 3);
    for (std::size_t t = len; t-- > 1;) std::swap(symbols[t], symbols[gen.next_u64() % (t + 1)]);
    for (std::size_t t = 0; t < len; ++t) {
      batch.tokens(b, t) = symbols[t] * n_payloads + payloads[std::size_t(symbols[t])];
      batch.targets(b, t) = payloads[std::size_t(beater(symbols[t]))];
    }
  }
  return batch;
}

std::string RpsTask::decode(const std::vector<std::int64_t>& tokens) const {
  std::string text;
  for (std::int64_t t : tokens) {
    if (t < 0 || t >= 3 * n_payloads) continue;
    if (!text.empty()) text += ' ';
    text += "RPS"[t / n_payloads];
    text += char('a' + t % n_payloads);
  }
  return text;
}

std::vector<std::int64_t> RpsTask::encode(const std::string& text) const {
  std::vector<std::int64_t> tokens;
  std::istringstream words(text);
  for (std::string w; words >> w;) {
    const auto symbol = std::string("RPS").find(w[0]);
    if (w.size() != 2 || symbol == std::string::npos || w[1] < 'a' || w[1] >= 'a' + n_payloads)
      fail("rps", "cannot read '{}' in \"{}\": items are a symbol R, P or S and a payload a-h, as Ra", w, text);
    tokens.push_back(std::int64_t(symbol) * n_payloads + (w[1] - 'a'));
  }
  return tokens;
}

std::string RpsTask::token_name(std::int64_t token) const { return decode({token}); }

// Two kinds of score can put the beater on top for at most two of a sequence's three queries, so
// their largest share is at most 2/3, exactly:
// - symmetric scores (tied, symmetric or identity heads), since the three wins would need
//   s(R,P) > s(R,S) = s(S,R) > s(S,P) = s(P,S) > s(P,R) = s(R,P);
// - rank-1 scores (d_head = 1), s(i,j) = q_i·k_j with scalars q and k: a query's highest score
//   falls on the item of largest k (q > 0) or of smallest k (q < 0), so two of the three items
//   are ever top, and three queries need three different ones.
// A sequence at 3/3 under either is a bug. (Accuracy itself can pass 2/3: the readout of a soft
// mixture of payloads can still land on the right one.)
RpsTask::BeaterRanking RpsTask::beater_ranking(const nn::Transformer& m, std::uint64_t seed) {
  const RpsTask three(3, 3);
  Generator gen(seed ^ 0x3c7c1eULL);
  const Batch batch = three.sample(512, gen);
  NoGradGuard no_grad;
  const Array<double> s = m.forward(batch.tokens, true).attention.back().scores.to(DType::float64).value<double>();
  double total = 0, worst = 0;
  for (std::size_t b = 0; b < batch.tokens.shape()[0]; ++b) {
    std::size_t at[3];  // the position of each symbol
    for (std::size_t t = 0; t < 3; ++t) at[batch.tokens(b, t) / n_payloads] = t;
    double right = 0;
    for (std::size_t sym = 0; sym < 3; ++sym) {  // sym + 1 beats sym; sym + 2 is beaten by it
      const std::size_t i = at[sym];
      const double beater = s(b, 0, i, at[(sym + 1) % 3]);
      right += beater > s(b, 0, i, at[(sym + 2) % 3]) && beater > s(b, 0, i, i) ? 1 : 0;
    }
    total += right / 3;
    worst = std::max(worst, right / 3);
  }
  return {total / double(batch.tokens.shape()[0]), worst};
}

TaskSpec rps_task() {
  return {.name = "rps",
          .make = [](std::size_t) { return std::make_unique<RpsTask>(); },
          .defaults =
              [](TrainOptions& o) {
                o.model.layers = 1;
                o.model.heads = 1;
                o.model.d_model = 32;
                o.steps = 1500;
              },
          .target = 0.99,
          .probe =
              [](const nn::Transformer& model, std::uint64_t seed) {
                const RpsTask::BeaterRanking r = RpsTask::beater_ranking(model, seed);
                Probe p{.values = {{"beater_top", r.mean}, {"beater_top_max", r.max}}, .violations = {}};
                const nn::TransformerConfig& c = model.config();
                const bool bounded = nn::symmetric_scores(c) || nn::head_dim(c) == 1;
                if (bounded && r.max > 2.0 / 3 + 1e-9)
                  p.violations.push_back("a symmetric or rank-1 score put every beater on top in a sequence, which it "
                                         "cannot: a bug");
                return p;
              },
          .probe_columns = {{"beater_top", "beater scored top (3 items)", "{:.3f}"}}};
}

}  // namespace qkv::tasks
