#include "qkv/analysis/fourier.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include <fmt/format.h>
#include <xtensor-blas/xlinalg.hpp>
#include <xtensor/xview.hpp>

#include "qkv/analysis/across_training.hpp"
#include "qkv/analysis/detail/f64.hpp"
#include "qkv/core/autograd.hpp"
#include "qkv/core/ops.hpp"
#include "qkv/nn/files.hpp"

namespace qkv::analysis {

namespace {

using detail::f64;

// Mean cross-entropy and accuracy of the rows `rows` of logits (p², C) against (a + b) mod p.
std::pair<double, double> loss_of(const Array<double>& logits, const std::vector<std::size_t>& rows, std::size_t p) {
  const std::size_t C = logits.shape()[1];
  double loss = 0, right = 0;
  for (std::size_t r : rows) {
    const double* row = &logits(r, 0);
    const std::size_t target = (r / p + r % p) % p;
    const double top = *std::max_element(row, row + C);
    double sum = 0;
    for (std::size_t c = 0; c < C; ++c) sum += std::exp(row[c] - top);
    loss += top + std::log(sum) - row[target];
    right += std::size_t(std::max_element(row, row + C) - row) == target;
  }
  return {loss / double(rows.size()), right / double(rows.size())};
}

// The pair index a · p + b of each row of a split.
std::vector<std::size_t> pair_rows(const tasks::Batch& rows, std::size_t p) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < rows.tokens.shape()[0]; ++i)
    out.push_back(std::size_t(rows.tokens(i, 0)) * p + std::size_t(rows.tokens(i, 1)));
  return out;
}

// Norm of each frequency's rows of F · W, for W's rows 0 … p − 1.
std::vector<double> frequency_norms(const Array<double>& basis, const Tensor& weight, std::size_t p) {
  const Array<double> w = xt::view(f64(weight), xt::range(0, p), xt::all());
  const Array<double> f = xt::linalg::dot(basis, w);
  std::vector<double> norms;
  for (std::size_t k = 0; k < frequency_count(p); ++k) {
    double sum = 0;
    for (std::size_t r : frequency_rows(p, k)) sum += xt::sum(xt::square(xt::view(f, r, xt::all())))();
    norms.push_back(std::sqrt(sum));
  }
  return norms;
}

}  // namespace

std::size_t frequency_count(std::size_t p) { return p / 2 + 1; }

std::vector<std::size_t> frequency_rows(std::size_t p, std::size_t k) {
  if (k >= frequency_count(p)) fail("frequency_rows", "frequency {} of Z_{}: the frequencies are 0 to {}", k, p, p / 2);
  if (k == 0) return {0};
  if (2 * k == p) return {p - 1};
  return {2 * k - 1, 2 * k};
}

Array<double> fourier_basis(std::size_t p) {
  if (p < 2) fail("fourier_basis", "p is {}: it must be at least 2", p);
  Array<double> basis = xt::zeros<double>({p, p});
  const double tau = 2 * std::numbers::pi / double(p);
  for (std::size_t x = 0; x < p; ++x) {
    basis(0, x) = 1;
    for (std::size_t k = 1; k < frequency_count(p); ++k) {
      const std::vector<std::size_t> rows = frequency_rows(p, k);
      basis(rows[0], x) = std::cos(tau * double(k * x));
      if (rows.size() == 2) basis(rows[1], x) = std::sin(tau * double(k * x));
    }
  }
  for (std::size_t r = 0; r < p; ++r) {
    auto row = xt::view(basis, r, xt::all());
    row /= std::sqrt(xt::sum(xt::square(row))());
  }
  return basis;
}

std::vector<std::string> fourier_basis_names(std::size_t p) {
  std::vector<std::string> names(p);
  for (std::size_t k = 0; k < frequency_count(p); ++k) {
    const std::vector<std::size_t> rows = frequency_rows(p, k);
    names[rows[0]] = k == 0 ? "const" : fmt::format("cos {}", k);
    if (rows.size() == 2) names[rows[1]] = fmt::format("sin {}", k);
  }
  return names;
}

std::vector<FrequencyShare> best_frequencies(const Array<double>& f) {
  if (f.dimension() != 3 || f.shape()[0] != f.shape()[1] || f.shape()[0] < 2)
    fail("best_frequencies", "functions of shape {}: expected (p, p, n)", to_string(to_shape(f.shape())));
  const std::size_t p = f.shape()[0], n = f.shape()[2];
  const Array<double> basis = fourier_basis(p), basis_t = xt::transpose(basis);
  const Array<double> functions = xt::transpose(f, {2, 0, 1});  // one (p, p) block a function
  // Each frequency's rows in a and in b, with the constant's: its terms are their pairs but (0, 0).
  std::vector<std::vector<std::size_t>> terms(frequency_count(p));
  for (std::size_t k = 1; k < terms.size(); ++k) {
    terms[k] = frequency_rows(p, k);
    terms[k].insert(terms[k].begin(), 0);
  }
  std::vector<FrequencyShare> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const Array<double> x = xt::view(functions, i, xt::all(), xt::all());
    const Array<double> power = xt::square(xt::linalg::dot(xt::linalg::dot(basis, x), basis_t));  // F x Fᵀ, squared
    const double total = xt::sum(power)() - power(0, 0);
    if (!(total > 1e-24 * xt::sum(xt::square(x))())) continue;  // constant, but for rounding
    for (std::size_t k = 1; k < terms.size(); ++k) {
      double sum = 0;
      for (std::size_t a : terms[k])
        for (std::size_t b : terms[k]) sum += a == 0 && b == 0 ? 0 : power(a, b);
      if (sum / total > out[i].share) out[i] = {.frequency = k, .share = sum / total};
    }
  }
  return out;
}

FourierAnalysis fourier_analysis(nn::Transformer& model, const tasks::ModAddTask& task, const FourierOptions& o) {
  const std::size_t p = task.p();
  const nn::TransformerConfig& c = model.config();
  if (c.readout != nn::Readout::token || c.vocab_size != p + 1 || c.n_classes < p || c.max_len < 3)
    fail("fourier_analysis", "a model of {} tokens, {} classes and {} positions ({} readout) does not read modadd's "
         "p = {}: {} tokens, at least {} classes, 3 positions, the token readout",
         c.vocab_size, c.n_classes, c.max_len, nn::name_of(c.readout), p, p + 1, p);
  if (!(o.threshold > 0 && o.threshold <= 1)) fail("fourier_analysis", "threshold is {}: it must be in (0, 1]", o.threshold);
  for (std::size_t k : o.key_frequencies.value_or(std::vector<std::size_t>{}))
    if (k == 0 || k >= frequency_count(p))
      fail("fourier_analysis", "key frequency {}: the frequencies of Z_{} are 1 to {}", k, p, p / 2);
  // All p² inputs run at once: the stream, the MLP and the logits at 3 positions in float32, then
  // the activations at "=" and the answers' logits (twice) in float64. Refused before any of it.
  const double D = double(c.d_model), hidden = c.mlp ? double(c.d_mlp ? c.d_mlp : 4 * c.d_model) : 0;
  const double need = double(p) * double(p) *
                      (12 * (6 * D + 2 * hidden + double(c.n_classes) + 3 * double(c.heads)) + 8 * (hidden + 2 * double(p) + double(c.heads)));
  if (const double available = nn::available_memory(); need > available)
    fail("fourier_analysis", "p = {}: reading all {} pairs at once needs about {:.1f} GiB, more than the {:.1f} GiB this "
         "machine has available", p, p * p, need / double(1 << 30), available / double(1 << 30));
  FourierAnalysis r;
  r.p = p;
  const Array<double> basis = fourier_basis(p);
  r.embed = frequency_norms(basis, model.tok.weight, p);
  r.unembed = frequency_norms(basis, model.head->weight, p);
  for (const Tensor& t : model.parameters()) r.weight_norm += xt::sum(xt::square(f64(t)))();

  // Every input a b =, a-major: row a · p + b.
  IndexArray tokens = tasks::filled(p * p, 3, std::int64_t(p));
  for (std::size_t i = 0; i < p * p; ++i) tokens(i, 0) = std::int64_t(i / p), tokens(i, 1) = std::int64_t(i % p);
  const std::size_t L = model.blocks.size();
  std::vector<std::string> points;
  for (std::size_t l = 0; l < L; ++l) points.push_back(fmt::format("blocks.{}.attn.hook_pattern", l));
  const bool mlp = model.blocks.back()->mlp != nullptr;
  if (mlp) points.push_back(fmt::format("blocks.{}.mlp.hook_post", L - 1));
  NoGradGuard no_grad;
  const nn::ActivationCache cache = model.run_with_cache(tokens, points);
  const auto at_equals = [&](const Tensor& t) {  // (p², 3, n) at "=", as (p, p, n)
    Array<double> out = f64(slice(t, 1, 2, 3));
    out.reshape({p, p, std::size_t(t.size(2))});
    return out;
  };
  if (mlp) {
    r.neurons = best_frequencies(at_equals(cache[points.back()]));
    r.neurons_per_frequency.assign(frequency_count(p), 0);
    for (const FrequencyShare& n : r.neurons)
      if (n.share >= o.threshold) ++r.neurons_per_frequency[n.frequency];
    for (const FrequencyShare& n : r.neurons)
      if (n.share > 0) r.found.push_back(n.frequency);
    std::sort(r.found.begin(), r.found.end());
    r.found.erase(std::unique(r.found.begin(), r.found.end()), r.found.end());
  }
  for (std::size_t l = 0; l < L; ++l) {
    const Array<double> pattern = f64(cache[points[l]]);  // (p², H, 3, 3): from "=" (query 2) to a (key 0)
    Array<double> to_a = xt::view(pattern, xt::all(), xt::all(), 2, 0);
    to_a.reshape({p, p, pattern.shape()[1]});
    r.heads.push_back(best_frequencies(to_a));
  }
  r.key_frequencies = o.key_frequencies.value_or(r.found);
  std::sort(r.key_frequencies.begin(), r.key_frequencies.end());
  r.key_frequencies.erase(std::unique(r.key_frequencies.begin(), r.key_frequencies.end()), r.key_frequencies.end());

  // The logits of the p answers at "=", (p², p).
  const Array<double> logits = f64(reshape(slice(slice(cache.output.logits, 1, 2, 3), 2, 0, std::int64_t(p)),
                                           {std::int64_t(p * p), std::int64_t(p)}));
  const tasks::Split& split = *task.split();
  const std::vector<std::size_t> train = pair_rows(split.train, p), test = pair_rows(split.test, p);
  std::vector<std::size_t> all(p * p);
  for (std::size_t i = 0; i < p * p; ++i) all[i] = i;
  std::tie(r.train_loss, r.train_accuracy) = loss_of(logits, train, p);
  std::tie(r.test_loss, r.test_accuracy) = loss_of(logits, test, p);
  // The logits along cos(ω_k(a + b)) and sin(ω_k(a + b)) over the inputs, for each key k.
  Array<double> along = xt::zeros_like(logits);
  const double tau = 2 * std::numbers::pi / double(p);
  for (std::size_t k : r.key_frequencies)
    for (const bool sine : {false, true}) {
      Array<double> u = xt::zeros<double>({p * p});
      for (std::size_t i = 0; i < p * p; ++i) {
        const double angle = tau * double(k * ((i / p + i % p) % p));
        u(i) = sine ? std::sin(angle) : std::cos(angle);
      }
      const double norm = std::sqrt(xt::sum(xt::square(u))());
      if (norm < 1e-9) continue;  // sin(π(a + b)) for even p: no direction
      u /= norm;
      const Array<double> coefficients = xt::linalg::dot(u, logits);  // (C)
      along += xt::linalg::outer(u, coefficients);
    }
  const Array<double> mean = xt::mean(logits, {0});
  const Array<double> restricted = along + xt::view(mean, xt::newaxis(), xt::all());
  const Array<double> excluded = logits - along;
  std::tie(r.restricted_loss, r.restricted_accuracy) = loss_of(restricted, all, p);
  std::tie(r.excluded_loss, r.excluded_accuracy) = loss_of(excluded, train, p);
  return r;
}

Grokking grokking(const FourierRun& run, const std::vector<TrainingHistory::Logged>& log) {
  Grokking g;
  for (const TrainingHistory::Logged& line : log) {
    if (!g.train_99 && line.accuracy >= 0.99) g.train_99 = line.step;
    if (!g.test_99 && line.test_accuracy && *line.test_accuracy >= 0.99) g.test_99 = line.step;
  }
  std::vector<std::pair<std::size_t, double>> restricted, excluded, norm;
  for (std::size_t i = 0; i < run.steps.size(); ++i) {
    restricted.emplace_back(run.steps[i], run.along[i].restricted_loss);
    excluded.emplace_back(run.steps[i], run.along[i].excluded_loss);
    norm.emplace_back(run.steps[i], run.along[i].weight_norm);
  }
  g.restricted = half_way_step(restricted);
  g.excluded = half_way_step(excluded);
  if (!norm.empty()) {
    const auto peak = std::max_element(norm.begin(), norm.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    g.weight_norm_peak = peak->first;
    g.weight_norm_fall = half_way_step({peak, norm.end()});
  }
  return g;
}

}  // namespace qkv::analysis
