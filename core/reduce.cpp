// sum, mean, max over axes. Backward reshapes d output to the kept-dimension shape and
// broadcasts it back over the reduced axes.
#include <xtensor/xmath.hpp>
#include <xtensor/xreducer.hpp>
#include <xtensor/xsort.hpp>
#include <xtensor/xstrided_view.hpp>

#include "qkv/core/detail/op.hpp"
#include "qkv/core/ops.hpp"

namespace qkv {

namespace {

const auto keep = xt::keep_dims | xt::evaluation_strategy::immediate;

struct Reduction {
  Shape in, kept, out;  // input, with reduced axes as 1, and the output (kept or dropped)
  std::vector<std::size_t> axes;
  std::size_t count = 1;  // elements reduced into each output
};

Reduction plan_for(const char* op, const Tensor& x, const std::vector<std::int64_t>& axes, bool keepdim) {
  Reduction r;
  r.in = r.kept = x.shape();
  r.axes = normalize_axes(op, axes, r.in.size());
  for (std::size_t a : r.axes) {
    r.count *= r.in[a];
    r.kept[a] = 1;
  }
  for (std::size_t d = 0; d < r.in.size(); ++d)
    if (keepdim || !std::binary_search(r.axes.begin(), r.axes.end(), d)) r.out.push_back(r.kept[d]);
  return r;
}

// d output broadcast back over the reduced axes, as an expression of the input's shape.
template <class T>
auto expand(const Array<T>& g, const Reduction& r) {
  return xt::broadcast(xt::reshape_view(g, r.kept), r.in);
}

template <class T>
Tensor sum_scaled(const char* op, const Tensor& x, const Reduction& r, T scale) {
  // xtensor's reducers read out of bounds on an empty input: a sum of nothing is 0 here.
  Array<T> y = numel(r.in) == 0 ? Array<T>(xt::zeros<T>(r.kept))
               : r.axes.empty()  ? Array<T>(x.value<T>())
                                 : Array<T>(xt::sum(x.value<T>(), r.axes, keep));
  if (scale != T(1)) y *= scale;
  y.reshape(r.out);
  return record_op<T>(op, std::move(y), {&x}, [r, scale](BackwardContext<T>& ctx) {
    if (numel(r.in) == 0) return ctx.accumulate(0, Array<T>::from_shape(r.in));
    ctx.accumulate(0, expand(ctx.grad(), r) * scale);
  });
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<std::int64_t>& axes, bool keepdim) {
  check_inputs("sum", {&x});
  const Reduction r = plan_for("sum", x, axes, keepdim);
  return dispatch(x.dtype(), [&](auto t) { return sum_scaled<decltype(t)>("sum", x, r, 1); });
}

Tensor mean(const Tensor& x, const std::vector<std::int64_t>& axes, bool keepdim) {
  check_inputs("mean", {&x});
  const Reduction r = plan_for("mean", x, axes, keepdim);
  // PyTorch's mean of nothing is NaN; here it is an error, unless no output needs a value.
  if (r.count == 0 && numel(r.out) != 0) fail("mean", "reducing over an empty axis of shape {}", to_string(r.in));
  return dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    return sum_scaled<T>("mean", x, r, r.count ? T(1) / static_cast<T>(r.count) : T(1));
  });
}

Tensor max(const Tensor& x, const std::vector<std::int64_t>& axes, bool keepdim) {
  check_inputs("max", {&x});
  const Reduction r = plan_for("max", x, axes, keepdim);
  // As in PyTorch, whenever a reduced axis is empty, even where the output would be empty too.
  if (r.count == 0) fail("max", "reducing over an empty axis of shape {}", to_string(r.in));
  return dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    Array<T> y = numel(r.in) == 0 ? Array<T>::from_shape(r.kept)
                 : r.axes.empty()  ? Array<T>(x.value<T>())
                                   : Array<T>(xt::amax(x.value<T>(), r.axes, keep));
    y.reshape(r.out);
    return record_op<T>("max", std::move(y), {&x}, [x, r](BackwardContext<T>& ctx) {
      // The gradient goes to the maxima, shared equally among ties.
      if (numel(r.in) == 0) return ctx.accumulate(0, Array<T>::from_shape(r.in));
      if (r.axes.empty()) return ctx.accumulate(0, ctx.grad());  // a 0-d input is its own max
      const Array<T> is_max = xt::cast<T>(xt::equal(x.value<T>(), expand(ctx.output(), r)));
      const Array<T> ties = xt::sum(is_max, r.axes, keep);
      ctx.accumulate(0, is_max * xt::broadcast(xt::reshape_view(ctx.grad(), r.kept) / ties, r.in));
    }, Save::output);
  });
}

}  // namespace qkv
