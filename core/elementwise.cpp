// Broadcasting arithmetic and pointwise functions, each forward beside its backward.
#include <algorithm>
#include <cmath>
#include <functional>
#include <numbers>

#include <xtensor/xmath.hpp>
#include <xtensor/xoperation.hpp>

#include "qkv/core/detail/broadcast.hpp"
#include "qkv/core/detail/kernels.hpp"
#include "qkv/core/detail/op.hpp"
#include "qkv/core/ops.hpp"

namespace qkv {

namespace {

// Whether `shape` is the trailing part of `of`: broadcasting then repeats it over `of`'s leading
// dimensions, as rows.
bool is_suffix(const Shape& shape, const Shape& of) {
  return shape.size() <= of.size() && std::equal(shape.begin(), shape.end(), of.end() - shape.size());
}

// input_i.grad += g summed back to the input's shape: over the leading dimensions broadcasting
// added, and over the dimensions where the input had size 1. One body for every gradient
// expression, which arrives evaluated.
template <class T>
void accumulate_summed(BackwardContext<T>& ctx, std::size_t i, const Array<T>& g, const Shape& shape) {
  const Shape g_shape = to_shape(g.shape());
  const std::size_t lead = g_shape.size() - shape.size();
  std::vector<std::size_t> axes;
  for (std::size_t d = 0; d < g_shape.size(); ++d)
    if (d < lead || (shape[d - lead] == 1 && g_shape[d] != 1)) axes.push_back(d);
  Array<T> summed = sum_over(g, axes);
  summed.reshape(shape);
  ctx.accumulate(i, std::move(summed));
}

template <class T, class E>
void accumulate_broadcast(BackwardContext<T>& ctx, std::size_t i, E&& g, const Shape& shape) {
  if (!ctx.needs(i)) return;
  if (to_shape(g.shape()) == shape) return ctx.accumulate(i, std::forward<E>(g));
  accumulate_summed<T>(ctx, i, std::forward<E>(g), shape);  // an expression evaluated, an array as it is
}

// The four binary ops differ in their forward expression and two gradient expressions, which get
// (d output, a, b). Only mul and div keep their inputs' values for backward.
template <class T, bool keeps_inputs, class Forward, class GradA, class GradB>
Tensor binary(const char* op, const Tensor& a, const Tensor& b, Forward forward, GradA grad_a, GradB grad_b) {
  broadcast_shapes(op, a.shape(), b.shape());
  Array<T> y = forward(a.value<T>(), b.value<T>());
  const Tensor kept_a = keeps_inputs ? a : Tensor(), kept_b = keeps_inputs ? b : Tensor();
  return record_op<T>(op, std::move(y), {&a, &b},
                      [kept_a, kept_b, sa = a.shape(), sb = b.shape(), grad_a, grad_b](BackwardContext<T>& ctx) {
                        if (ctx.needs(0)) accumulate_broadcast(ctx, 0, grad_a(ctx.grad(), kept_a, kept_b), sa);
                        if (ctx.needs(1)) accumulate_broadcast(ctx, 1, grad_b(ctx.grad(), kept_a, kept_b), sb);
                      });
}

template <class T, class Forward, class Backward>
Tensor unary(const char* op, const Tensor& x, Forward forward, Backward backward, Save save = Save::nothing) {
  Array<T> y = forward(x.value<T>());
  return record_op<T>(op, std::move(y), {&x}, [x, backward](BackwardContext<T>& ctx) {
    ctx.accumulate(0, backward(ctx, x.value<T>()));
  }, save);
}

// x + y by a vectorised loop when the shapes are equal or one is the trailing part of the other
// (a residual sum, a bias or positions added to every row); by xtensor's broadcasting otherwise.
template <class T>
Array<T> sum_of(const Array<T>& x, const Array<T>& y) {
  const Shape sx = to_shape(x.shape()), sy = to_shape(y.shape());
  if (!is_suffix(sy, sx) && !is_suffix(sx, sy)) return x + y;
  const bool y_is_row = is_suffix(sy, sx);
  const Array<T>& rows = y_is_row ? x : y;
  const Array<T>& row = y_is_row ? y : x;
  Array<T> out = Array<T>::from_shape(rows.shape());
  if (row.size() > 0) detail::add_rows(rows.data(), rows.size() / row.size(), row.size(), row.data(), out.data());
  return out;
}

// x ∘ y, elementwise with broadcasting: a loop over runs (detail::for_each_run) when one of the
// two has the result's shape (a bias, a scale, a mask, a gradient against a broadcast input), which
// gives each element the same bits as xtensor's broadcasting (`generic`, otherwise) does.
template <class T, class Op, class Generic>
Array<T> combined(const Array<T>& x, const Array<T>& y, Op op, Generic generic) {
  const Shape sx = to_shape(x.shape()), sy = to_shape(y.shape());
  const std::optional<Shape> out = try_broadcast_shapes(sx, sy);
  if (!out || (*out != sx && *out != sy)) return generic(x, y);
  Array<T> result = Array<T>::from_shape(*out);
  T* r = result.data();
  const T *a = x.data(), *b = y.data();
  if (*out == sx && y.size() == 1) {
    for (std::size_t k = 0; k < x.size(); ++k) r[k] = op(a[k], b[0]);
  } else if (*out == sy && x.size() == 1) {
    for (std::size_t k = 0; k < y.size(); ++k) r[k] = op(a[0], b[k]);
  } else if (*out == sx) {
    detail::for_each_run(sx, sy, [&](std::size_t o, std::size_t i, std::size_t n) {
      for (std::size_t k = 0; k < n; ++k) r[o + k] = op(a[o + k], b[i + k]);
    });
  } else {
    detail::for_each_run(sy, sx, [&](std::size_t o, std::size_t i, std::size_t n) {
      for (std::size_t k = 0; k < n; ++k) r[o + k] = op(a[i + k], b[o + k]);
    });
  }
  return result;
}

template <class T>
Array<T> difference(const Array<T>& x, const Array<T>& y) {
  return combined(x, y, std::minus<T>(), [](const Array<T>& u, const Array<T>& v) -> Array<T> { return u - v; });
}

template <class T>
Array<T> product(const Array<T>& x, const Array<T>& y) {
  return combined(x, y, std::multiplies<T>(), [](const Array<T>& u, const Array<T>& v) -> Array<T> { return u * v; });
}

template <class T>
Array<T> quotient(const Array<T>& x, const Array<T>& y) {
  return combined(x, y, std::divides<T>(), [](const Array<T>& u, const Array<T>& v) -> Array<T> { return u / v; });
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  check_inputs("add", {&a, &b});
  return dispatch(a.dtype(), [&](auto t) {
    using T = decltype(t);
    return binary<T, false>("add", a, b, [](const Array<T>& x, const Array<T>& y) { return sum_of(x, y); },
                            [](const Array<T>& g, const Tensor&, const Tensor&) -> const Array<T>& { return g; },
                            [](const Array<T>& g, const Tensor&, const Tensor&) -> const Array<T>& { return g; });
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  check_inputs("sub", {&a, &b});
  return dispatch(a.dtype(), [&](auto t) {
    using T = decltype(t);
    return binary<T, false>("sub", a, b, [](const Array<T>& x, const Array<T>& y) { return difference(x, y); },
                            [](const Array<T>& g, const Tensor&, const Tensor&) -> const Array<T>& { return g; },
                            [](const Array<T>& g, const Tensor&, const Tensor&) { return -g; });
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  check_inputs("mul", {&a, &b});
  return dispatch(a.dtype(), [&](auto t) {
    using T = decltype(t);
    return binary<T, true>("mul", a, b, [](const Array<T>& x, const Array<T>& y) { return product(x, y); },
                           [](const Array<T>& g, const Tensor&, const Tensor& y) { return product(g, y.value<T>()); },
                           [](const Array<T>& g, const Tensor& x, const Tensor&) { return product(g, x.value<T>()); });
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  check_inputs("div", {&a, &b});
  return dispatch(a.dtype(), [&](auto t) {
    using T = decltype(t);
    // forward was q = x / y, so dq/dx = 1/y and dq/dy = -x/y².
    return binary<T, true>("div", a, b, [](const Array<T>& x, const Array<T>& y) { return quotient(x, y); },
                           [](const Array<T>& g, const Tensor&, const Tensor& y) { return quotient(g, y.value<T>()); },
                           [](const Array<T>& g, const Tensor& x, const Tensor& y) {
                             return -g * x.value<T>() / (y.value<T>() * y.value<T>());
                           });
  });
}

Tensor neg(const Tensor& x) {
  check_inputs("neg", {&x});
  return dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    return unary<T>("neg", x, [](const auto& v) { return -v; },
                    [](BackwardContext<T>& ctx, const auto&) { return -ctx.grad(); });
  });
}

Tensor exp(const Tensor& x) {
  check_inputs("exp", {&x});
  return dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    return unary<T>("exp", x, [](const auto& v) { return detail::exp_of<T>(v); },
                    [](BackwardContext<T>& ctx, const auto&) { return ctx.grad() * ctx.output(); }, Save::output);
  });
}

Tensor log(const Tensor& x) {
  check_inputs("log", {&x});
  return dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    return unary<T>("log", x, [](const auto& v) { return xt::log(v); },
                    [](BackwardContext<T>& ctx, const auto& v) { return ctx.grad() / v; });
  });
}

Tensor sqrt(const Tensor& x) {
  check_inputs("sqrt", {&x});
  return dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    // forward was y = √x, so dy/dx = 1 / (2y).
    return unary<T>("sqrt", x, [](const auto& v) { return xt::sqrt(v); },
                    [](BackwardContext<T>& ctx, const auto&) { return ctx.grad() / (T(2) * ctx.output()); },
                    Save::output);
  });
}

Tensor pow(const Tensor& x, double exponent) {
  check_inputs("pow", {&x});
  return dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    const T p = static_cast<T>(exponent);
    return unary<T>("pow", x, [p](const auto& v) { return xt::pow(v, p); },
                    [p](BackwardContext<T>& ctx, const auto& v) { return ctx.grad() * p * xt::pow(v, p - T(1)); });
  });
}

Tensor tanh(const Tensor& x) {
  check_inputs("tanh", {&x});
  return dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    return unary<T>("tanh", x, [](const auto& v) { return xt::tanh(v); },
                    [](BackwardContext<T>& ctx, const auto&) {
                      return ctx.grad() * (T(1) - ctx.output() * ctx.output());
                    }, Save::output);
  });
}

Tensor relu(const Tensor& x) {
  check_inputs("relu", {&x});
  return dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    // The gradient at exactly 0 is 0, as in PyTorch. Both passes split across the pool.
    return unary<T>("relu", x, [](const Array<T>& v) {
                      Array<T> y = Array<T>::from_shape(v.shape());
                      detail::relu(v.data(), v.size(), y.data());
                      return y;
                    },
                    [](BackwardContext<T>& ctx, const auto&) {
                      Array<T> dx = Array<T>::from_shape(ctx.grad().shape());
                      detail::relu_backward(ctx.output().data(), ctx.grad().data(), dx.size(), dx.data());
                      return dx;
                    }, Save::output);
  });
}

Tensor gelu(const Tensor& x, GeluApproximation approximate) {
  check_inputs("gelu", {&x});
  return dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    if (approximate == GeluApproximation::none) {
      // y = x Φ(x), Φ(x) = (1 + erf(x/√2)) / 2; dy/dx = Φ(x) + x φ(x), φ(x) = exp(-x²/2) / √(2π).
      const T inv_sqrt2 = T(1) / std::numbers::sqrt2_v<T>;
      const T inv_sqrt_2pi = std::numbers::inv_sqrtpi_v<T> * inv_sqrt2;
      return unary<T>("gelu", x, [=](const auto& v) { return T(0.5) * v * (T(1) + xt::erf(v * inv_sqrt2)); },
                      [=](BackwardContext<T>& ctx, const auto& v) {
                        return ctx.grad() * (T(0.5) * (T(1) + xt::erf(v * inv_sqrt2)) +
                                             v * inv_sqrt_2pi * detail::exp_of<T>(T(-0.5) * v * v));
                      });
    }
    // y = x (1 + tanh(u)) / 2, u = c (x + a x³); dy/dx = (1 + th)/2 + x (1 - th²) c (1 + 3a x²) / 2.
    const T c = std::numbers::sqrt2_v<T> * std::numbers::inv_sqrtpi_v<T>;  // √(2/π)
    const T a = T(0.044715);
    return unary<T>("gelu", x, [=](const auto& v) { return T(0.5) * v * (T(1) + xt::tanh(c * (v + a * v * v * v))); },
                    [=](BackwardContext<T>& ctx, const auto& v) {
                      const Array<T> th = xt::tanh(c * (v + a * v * v * v));
                      return Array<T>(ctx.grad() * (T(0.5) * (T(1) + th) +
                                                    T(0.5) * v * (T(1) - th * th) * c * (T(1) + T(3) * a * v * v)));
                    });
  });
}

Tensor cast(const Tensor& x, DType dtype) {
  check_inputs("cast", {&x});
  return dispatch(x.dtype(), [&](auto from) {
    using S = decltype(from);
    return dispatch(dtype, [&](auto to) {
      using U = decltype(to);
      Array<U> y = xt::cast<U>(x.value<S>());
      return record_op<U>("cast", std::move(y), {&x}, [](BackwardContext<U>& ctx) {
        ctx.accumulate(0, xt::cast<S>(ctx.grad()));
      });
    });
  });
}

Tensor Tensor::to(DType dtype) const { return cast(*this, dtype); }

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator+(const Tensor& a, double b) { return add(a, scalar(b, a.dtype())); }
Tensor operator-(const Tensor& a, double b) { return sub(a, scalar(b, a.dtype())); }
Tensor operator*(const Tensor& a, double b) { return mul(a, scalar(b, a.dtype())); }
Tensor operator/(const Tensor& a, double b) { return div(a, scalar(b, a.dtype())); }
Tensor operator+(double a, const Tensor& b) { return add(scalar(a, b.dtype()), b); }
Tensor operator-(double a, const Tensor& b) { return sub(scalar(a, b.dtype()), b); }
Tensor operator*(double a, const Tensor& b) { return mul(scalar(a, b.dtype()), b); }
Tensor operator/(double a, const Tensor& b) { return div(scalar(a, b.dtype()), b); }

}  // namespace qkv
