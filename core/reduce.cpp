// sum, mean, max over axes. Backward reshapes d output to the kept-dimension shape and
// broadcasts it back over the reduced axes.
#include <xtensor/xmanipulation.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xreducer.hpp>
#include <xtensor/xsort.hpp>
#include <xtensor/xstrided_view.hpp>

#include "qkv/core/detail/op.hpp"
#include "qkv/core/ops.hpp"

namespace qkv {

namespace {

using detail::keep;

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

// sum and mean: the sum over the axes, divided by `divisor` (1 for sum), as PyTorch's mean divides.
template <class T>
Tensor sum_divided(const char* op, const Tensor& x, const Reduction& r, T divisor) {
  Array<T> y = sum_over(x.value<T>(), r.axes);
  if (divisor != T(1)) y /= divisor;
  y.reshape(r.out);
  return record_op<T>(op, std::move(y), {&x}, [r, divisor](BackwardContext<T>& ctx) {
    if (numel(r.in) == 0) return ctx.accumulate(0, Array<T>::from_shape(r.in));
    ctx.accumulate(0, expand(ctx.grad(), r) / divisor);
  });
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<std::int64_t>& axes, bool keepdim) {
  check_inputs("sum", {&x});
  const Reduction r = plan_for("sum", x, axes, keepdim);
  return dispatch(x.dtype(), [&](auto t) { return sum_divided<decltype(t)>("sum", x, r, 1); });
}

Tensor mean(const Tensor& x, const std::vector<std::int64_t>& axes, bool keepdim) {
  check_inputs("mean", {&x});
  const Reduction r = plan_for("mean", x, axes, keepdim);
  // PyTorch's mean of nothing is NaN; here it is an error, unless no output needs a value.
  if (r.count == 0 && numel(r.out) != 0) fail("mean", "reducing over an empty axis of shape {}", to_string(r.in));
  return dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    return sum_divided<T>("mean", x, r, r.count ? static_cast<T>(r.count) : T(1));
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

template <class T>
Array<T> detail::sum_over(const Array<T>& x, const std::vector<std::size_t>& axes) {
  if (axes.empty()) return x;
  const Shape in = to_shape(x.shape());
  Shape kept = in;
  for (std::size_t a : axes) kept[a] = 1;
  if (axes.back() - axes.front() + 1 != axes.size()) {  // not one run of axes: moved last, a copy
    std::vector<std::size_t> order, last;
    for (std::size_t d = 0; d < in.size(); ++d)
      if (!std::binary_search(axes.begin(), axes.end(), d)) order.push_back(d);
    for (std::size_t a : axes) {
      last.push_back(order.size());
      order.push_back(a);
    }
    Array<T> summed = sum_over(Array<T>(xt::transpose(x, order)), last);
    summed.reshape(kept);
    return summed;
  }
  // x as (outer, len, inner), the reduced axes in the middle: each output is the sum of a column
  // of one (len, inner) block, a contiguous run when inner = 1.
  std::size_t outer = 1, len = 1, inner = 1;
  for (std::size_t d = 0; d < in.size(); ++d) (d < axes.front() ? outer : d > axes.back() ? inner : len) *= in[d];
  Array<T> out = xt::zeros<T>(kept);
  if (len > 0 && out.size() > 0)  // else a sum of nothing, 0, or no sum
    for (std::size_t o = 0; o < outer; ++o) add_column_sums(x.data() + o * len * inner, len, inner, out.data() + o * inner);
  return out;
}
template Array<float> detail::sum_over(const Array<float>&, const std::vector<std::size_t>&);
template Array<double> detail::sum_over(const Array<double>&, const std::vector<std::size_t>&);

}  // namespace qkv
