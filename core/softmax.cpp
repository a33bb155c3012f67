// softmax and log_softmax along an axis (max-subtracted), and masked_fill.
#include <cmath>
#include <limits>

#include <xtensor/xmath.hpp>
#include <xtensor/xreducer.hpp>
#include <xtensor/xsort.hpp>

#include "qkv/core/detail/op.hpp"
#include "qkv/core/ops.hpp"

namespace qkv {

namespace {

const auto keep = xt::keep_dims | xt::evaluation_strategy::immediate;

// Per row: the max to subtract (0 for a row that is all -inf, so that exp gives 0s, not NaN),
// the shifted exponentials, and their sum.
template <class T>
struct Shifted {
  Array<T> max, exp, sum;
};

template <class T>
Shifted<T> shifted(const Array<T>& x, std::size_t axis) {
  if (x.size() == 0) return {x, x, x};  // xtensor's reducers read out of bounds on an empty input
  Shifted<T> s;
  const std::array<std::size_t, 1> axes{axis};
  s.max = xt::amax(x, axes, keep);
  for (T& m : s.max)
    if (m == -std::numeric_limits<T>::infinity()) m = T(0);
  s.exp = detail::exp_of<T>(x - s.max);
  s.sum = xt::sum(s.exp, axes, keep);
  return s;
}

}  // namespace

Tensor softmax(const Tensor& x, std::int64_t axis) {
  check_inputs("softmax", {&x});
  const std::size_t ax = normalize_axis("softmax", axis, x.dim());
  return dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    Shifted<T> s = shifted(x.value<T>(), ax);
    Array<T> y = xt::where(s.sum > T(0), s.exp / s.sum, T(0));  // a fully masked row gives 0s
    return record_op<T>("softmax", std::move(y), {&x}, [ax](BackwardContext<T>& ctx) {
      // forward was y = softmax(x), so dx = y ⊙ (dy − Σ_row dy ⊙ y); 0 where y is 0.
      const auto& y = ctx.output();
      if (y.size() == 0) return ctx.accumulate(0, Array<T>(y));
      const Array<T> dot = xt::sum(ctx.grad() * y, std::array<std::size_t, 1>{ax}, keep);
      ctx.accumulate(0, y * (ctx.grad() - dot));
    }, Save::output);
  });
}

Tensor log_softmax(const Tensor& x, std::int64_t axis) {
  check_inputs("log_softmax", {&x});
  const std::size_t ax = normalize_axis("log_softmax", axis, x.dim());
  return dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    const Array<T>& xv = x.value<T>();
    Shifted<T> s = shifted(xv, ax);
    // −inf on a fully masked row (log 0), where x − max − log Σ would be −inf + inf = NaN.
    Array<T> y = xt::where(s.sum > T(0), xv - s.max - xt::log(s.sum), -std::numeric_limits<T>::infinity());
    return record_op<T>("log_softmax", std::move(y), {&x}, [ax](BackwardContext<T>& ctx) {
      // forward was y = x − logΣexp(x), so dx = dy − softmax(x) Σ_row dy; softmax = exp(y) is 0
      // on a fully masked row, whose gradient is then 0 too.
      if (ctx.output().size() == 0) return ctx.accumulate(0, Array<T>(ctx.output()));
      const Array<T> p = detail::exp_of<T>(ctx.output());
      const Array<T> total = xt::sum(ctx.grad(), std::array<std::size_t, 1>{ax}, keep);
      const Array<T> row_alive = xt::cast<T>(xt::sum(p, std::array<std::size_t, 1>{ax}, keep) > T(0));
      ctx.accumulate(0, (ctx.grad() - p * total) * row_alive);
    }, Save::output);
  });
}

Tensor masked_fill(const Tensor& x, const MaskArray& mask, double value) {
  check_inputs("masked_fill", {&x});
  const Shape sx = x.shape(), sm = to_shape(mask.shape());
  if (broadcast_shapes("masked_fill", sx, sm) != sx)
    fail("masked_fill", "mask of shape {} does not broadcast to the input's shape {}", to_string(sm), to_string(sx));
  return dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    const T v = static_cast<T>(value);
    Array<T> y = xt::where(mask, v, x.value<T>());
    return record_op<T>("masked_fill", std::move(y), {&x}, [mask](BackwardContext<T>& ctx) {
      ctx.accumulate(0, xt::where(mask, T(0), ctx.grad()));
    }, Save::nothing, /*infinite_inputs=*/!std::isfinite(value));
  });
}

}  // namespace qkv
