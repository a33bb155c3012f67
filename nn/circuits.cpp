#include "qkv/nn/circuits.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <xtensor-blas/xlinalg.hpp>

#include "qkv/core/autograd.hpp"
#include "qkv/core/ops.hpp"

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

}  // namespace qkv::nn
