#include "qkv/core/gradcheck.hpp"

#include <cmath>

#include "qkv/core/autograd.hpp"
#include "qkv/core/random.hpp"
#include "qkv/core/shape.hpp"

namespace qkv {

namespace {

// (1,2) for flat index 5 of shape (2,3).
std::string multi_index(std::size_t flat, const Shape& shape) {
  Shape index(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return to_string(index);
}

double dot(const Array<double>& a, const Array<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a.data()[i] * b.data()[i];
  return s;
}

}  // namespace

GradcheckResult gradcheck(const GradcheckFunction& f, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& options) {
  bool any = false;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined() || inputs[i].dtype() != DType::float64 || !inputs[i].is_leaf())
      fail("gradcheck", "input {} must be a defined float64 leaf", i);
    any = any || inputs[i].requires_grad();
  }
  if (!any) fail("gradcheck", "no input requires grad");
  if (!(options.eps > 0)) fail("gradcheck", "eps must be positive, got {}", options.eps);

  std::vector<Tensor> xs = inputs;
  for (Tensor& x : xs) x.zero_grad();
  const Tensor y = f(xs);
  if (!y.defined() || y.dtype() != DType::float64)
    fail("gradcheck", "the function must return a defined float64 tensor");
  Generator gen(options.seed);
  const Tensor u = randn(y.shape(), DType::float64, gen);
  if (y.requires_grad()) y.backward(u);

  GradcheckResult result;
  double worst = 0;  // how far past its tolerance the worst failing element is
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (!xs[i].requires_grad()) continue;
    const Tensor g = xs[i].grad();
    Array<double>& x = xs[i].mutable_value<double>();
    for (std::size_t j = 0; j < x.size(); ++j) {
      const double saved = x.data()[j];
      double up, down;
      {
        NoGradGuard no_grad;
        x.data()[j] = saved + options.eps;
        up = dot(f(xs).value<double>(), u.value<double>());
        x.data()[j] = saved - options.eps;
        down = dot(f(xs).value<double>(), u.value<double>());
        x.data()[j] = saved;
      }
      const double numeric = (up - down) / (2 * options.eps);
      const double analytic = g.defined() ? g.value<double>().data()[j] : 0.0;
      const double err = std::abs(analytic - numeric);
      const double tolerance = options.atol + options.rtol * std::abs(numeric);
      result.max_abs_error = std::max(result.max_abs_error, err);
      result.max_rel_error = std::max(result.max_rel_error, err / std::max(std::abs(numeric), options.atol));
      ++result.checked;
      if (!(err <= tolerance) && (result.passed || err - tolerance > worst)) {
        result.passed = false;
        worst = err - tolerance;
        result.failure = fmt::format("input {} index {}: analytic {:.10g}, numeric {:.10g} (error {:.3g}, tolerance {:.3g})",
                                     i, multi_index(j, to_shape(x.shape())), analytic, numeric, err, tolerance);
      }
    }
  }
  for (Tensor& x : xs) x.zero_grad();
  return result;
}

}  // namespace qkv
