#include "qkv/nn/circuits.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <xtensor-blas/xlinalg.hpp>

#include "qkv/core/autograd.hpp"
#include "qkv/core/ops.hpp"
#include "qkv/nn/transformer.hpp"

namespace qkv::nn {

namespace {

Array<double> f64(const Tensor& t) { return t.to(DType::float64).value<double>(); }

void check_square(const char* op, const Array<double>& a) {
  if (a.dimension() != 2 || a.shape()[0] != a.shape()[1])
    fail(op, "needs a square matrix, got shape {}", to_string(Shape(a.shape().begin(), a.shape().end())));
}

double frobenius_squared(const Array<double>& a) {
  double total = 0;
  for (double v : a) total += v * v;
  return total;
}

}  // namespace

Array<double> qk_circuit(const MultiHeadAttention& attention, std::size_t h) {
  NoGradGuard no_grad;
  return xt::linalg::dot(f64(attention.W_q(h)), xt::transpose(f64(attention.W_k(h))));
}

Array<double> ov_circuit(const MultiHeadAttention& attention, std::size_t h) {
  NoGradGuard no_grad;
  return xt::linalg::dot(f64(attention.W_v(h)), f64(attention.W_o(h)));
}

double composition_score(const MultiHeadAttention& writer, std::size_t h1, const MultiHeadAttention& reader, std::size_t h2,
                         Composition kind) {
  const Array<double> a = ov_circuit(writer, h1);
  const Array<double> b = kind == Composition::v   ? ov_circuit(reader, h2)
                          : kind == Composition::q ? qk_circuit(reader, h2)
                                                   : Array<double>(xt::transpose(qk_circuit(reader, h2)));
  const double norms = std::sqrt(frobenius_squared(a) * frobenius_squared(b));
  if (norms == 0) fail("composition_score", "is undefined when a head's circuit is zero");
  return std::sqrt(frobenius_squared(xt::linalg::dot(a, b))) / norms;
}

double symmetric_share(const Array<double>& a) {
  check_square("symmetric_share", a);
  const double total = frobenius_squared(a);
  if (total == 0) fail("symmetric_share", "is undefined for a zero matrix");
  const Array<double> sym = 0.5 * (a + xt::transpose(a));
  return frobenius_squared(sym) / total;
}

double antisymmetry(const Array<double>& a) {
  check_square("antisymmetry", a);
  const double total = frobenius_squared(a);
  if (total == 0) fail("antisymmetry", "is undefined for a zero matrix");
  const Array<double> diff = a - xt::transpose(a);
  return std::sqrt(frobenius_squared(diff) / total);
}

std::optional<double> softmax_invariant_asymmetry(const Array<double>& s, const MaskArray& allowed) {
  check_square("softmax_invariant_asymmetry", s);
  const std::size_t T = s.shape()[0];
  if (to_shape(allowed.shape()) != Shape{T, T})
    fail("softmax_invariant_asymmetry", "mask of shape {} for scores of shape ({},{})", to_string(to_shape(allowed.shape())),
         T, T);
  // P: the pairs i ≠ j whose scores both count, S_ij (query i sees key j) and S_ji.
  const auto in_p = [&](std::size_t i, std::size_t j) { return i != j && allowed(i, j) && allowed(j, i); };
  // Each row centred over the keys its query sees: the constant softmax ignores.
  Array<double> centred = s;
  for (std::size_t i = 0; i < T; ++i) {
    double total = 0, n = 0;
    for (std::size_t j = 0; j < T; ++j)
      if (allowed(i, j) && std::isfinite(s(i, j))) total += s(i, j), ++n;
    for (std::size_t j = 0; j < T; ++j) centred(i, j) -= n > 0 ? total / n : 0;
  }
  // A = S − Sᵀ on P, less the part per-query constants c make, c_i − c_j: the c that minimises
  // Σ_P (A_ij + c_i − c_j)² solves L c = −div A, L the Laplacian of P, div A_i = Σ_{j∈P(i)} A_ij.
  Array<double> laplacian = xt::zeros<double>({T, T}), divergence = xt::zeros<double>({T});
  std::size_t pairs = 0;
  for (std::size_t i = 0; i < T; ++i)
    for (std::size_t j = 0; j < T; ++j)
      if (in_p(i, j)) {
        if (!std::isfinite(s(i, j))) return std::nullopt;  // a diverged model: nothing to measure
        laplacian(i, i) += 1;
        laplacian(i, j) -= 1;
        divergence(i) -= s(i, j) - s(j, i);
        ++pairs;
      }
  if (pairs == 0) return std::nullopt;
  const Array<double> c = std::get<0>(xt::linalg::lstsq(laplacian, divergence));
  double left = 0, total = 0;
  for (std::size_t i = 0; i < T; ++i)
    for (std::size_t j = 0; j < T; ++j)
      if (in_p(i, j)) {
        const double a = s(i, j) - s(j, i) + c(i) - c(j);
        left += a * a;
        total += centred(i, j) * centred(i, j);
      }
  return total > 0 ? std::sqrt(left / total) : 0.0;
}

MatrixSpectrum spectrum(const Array<double>& a) {
  if (a.dimension() != 2 || a.size() == 0)
    fail("spectrum", "needs a non-empty matrix, got shape {}", to_string(Shape(a.shape().begin(), a.shape().end())));
  if (std::any_of(a.begin(), a.end(), [](double v) { return !std::isfinite(v); }))
    fail("spectrum", "the matrix holds a non-finite value");
  MatrixSpectrum out;
  const auto svd = xt::linalg::svd(a, false, false);
  const auto& s = std::get<1>(svd);
  out.singular_values.assign(s.begin(), s.end());
  std::sort(out.singular_values.rbegin(), out.singular_values.rend());
  const double top = out.singular_values.front();
  if (top > 0) {
    double energy = 0;
    for (double v : out.singular_values) energy += v * v;
    out.stable_rank = energy / (top * top);
    const double tolerance =
        double(std::max(a.shape()[0], a.shape()[1])) * std::numeric_limits<double>::epsilon() * top;
    out.rank = std::size_t(std::count_if(out.singular_values.begin(), out.singular_values.end(),
                                         [&](double v) { return v > tolerance; }));
  }
  if (a.shape()[0] == a.shape()[1]) {
    const auto eig = xt::linalg::eigvals(a);
    out.eigenvalues.assign(eig.begin(), eig.end());
    // By modulus, descending. The two members of a conjugate pair have the same modulus, bit for
    // bit, so they stay together, the one with the positive imaginary part first.
    std::sort(out.eigenvalues.begin(), out.eigenvalues.end(), [](auto x, auto y) {
      const double mx = std::abs(x), my = std::abs(y);
      return mx != my ? mx > my : x.imag() > y.imag();
    });
  }
  return out;
}

Tensor table_scores(const TransformerBlock& block, const Tensor& table) {
  NoGradGuard no_grad;
  const Tensor stream = reshape(table, {1, -1, std::int64_t(table.size(1))});
  return block.attn.forward(block.ln1 ? (*block.ln1)(stream) : stream, {}, true).scores;
}

}  // namespace qkv::nn
