// softmax and log_softmax along an axis (max-subtracted), and masked_fill.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <xtensor/xmath.hpp>
#include <xtensor/xreducer.hpp>
#include <xtensor/xsort.hpp>

#include "qkv/core/detail/broadcast.hpp"
#include "qkv/core/detail/kernels.hpp"
#include "qkv/core/detail/op.hpp"
#include "qkv/core/ops.hpp"

namespace qkv {

namespace {

using detail::keep;

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
  for (T& m : s.max) detail::to_softmax_shift(m);
  s.exp = detail::exp_of<T>(x - s.max);
  s.sum = sum_over(s.exp, {axis});
  return s;
}

// The vectors along `axis` of arrays of one shape, as the kernel's blocks: vector v = (o, i) (outer
// index o, inner index i) holds x[(o·len + j)·inner + i] for j < len. Blocks of 16 vectors of each
// input are copied into the columns of a (len, 16) block, `kernel` runs on them, and the last
// block is copied into `out`.
template <class T, class F>
void for_each_block_of_vectors(const Shape& shape, std::size_t axis, const std::vector<const T*>& in, T* out,
                               F&& kernel) {
  const std::size_t len = shape[axis];
  std::size_t outer = 1, inner = 1;
  for (std::size_t d = 0; d < axis; ++d) outer *= shape[d];
  for (std::size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  constexpr std::size_t lanes = detail::softmax_lanes;
  std::vector<std::vector<T>> blocks(in.size(), std::vector<T>(len * lanes));
  std::size_t base[lanes];
  for (std::size_t v0 = 0; v0 < outer * inner; v0 += lanes) {
    const std::size_t n = std::min(lanes, outer * inner - v0);
    std::int32_t limits[lanes] = {};
    for (std::size_t c = 0; c < n; ++c) {
      base[c] = (v0 + c) / inner * len * inner + (v0 + c) % inner;
      limits[c] = std::int32_t(len);
    }
    for (std::size_t a = 0; a < in.size(); ++a)
      for (std::size_t c = 0; c < n; ++c)
        for (std::size_t j = 0; j < len; ++j) blocks[a][j * lanes + c] = in[a][base[c] + j * inner];
    kernel(blocks, limits);
    for (std::size_t c = 0; c < n; ++c)
      for (std::size_t j = 0; j < len; ++j) out[base[c] + j * inner] = blocks.back()[j * lanes + c];
  }
}

}  // namespace

Tensor softmax(const Tensor& x, std::int64_t axis) {
  check_inputs("softmax", {&x});
  const std::size_t ax = normalize_axis("softmax", axis, x.dim());
  if (x.shape()[ax] > std::size_t(std::numeric_limits<std::int32_t>::max()))
    fail("softmax", "a vector of {} entries along axis {} is longer than the kernel takes", x.shape()[ax], ax);
  return dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    // The attention kernel's softmax (detail::softmax_columns), 16 vectors at a time; a fully
    // masked vector (every entry −inf) gives 0s.
    const Shape shape = x.shape();
    Array<T> y = Array<T>::from_shape(shape);
    for_each_block_of_vectors<T>(shape, ax, {x.value<T>().data()}, y.data(), [](auto& blocks, const std::int32_t* limits) {
      detail::softmax_columns(blocks[0].data(), detail::softmax_lanes, blocks[0].size() / detail::softmax_lanes,
                              limits, T(1));
    });
    return record_op<T>("softmax", std::move(y), {&x}, [ax](BackwardContext<T>& ctx) {
      // forward was y = softmax(x), so dx = y ⊙ (dy − Σ_vector dy ⊙ y); 0 where y is 0.
      const Shape shape = to_shape(ctx.output().shape());
      Array<T> dx = Array<T>::from_shape(shape);
      for_each_block_of_vectors<T>(shape, ax, {ctx.output().data(), ctx.grad().data()}, dx.data(),
                                   [](auto& blocks, const std::int32_t* limits) {
        detail::softmax_backward_columns(blocks[0].data(), blocks[1].data(), detail::softmax_lanes,
                                         blocks[0].size() / detail::softmax_lanes, limits, T(1));
      });
      ctx.accumulate(0, std::move(dx));
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
      const Array<T> total = sum_over(ctx.grad(), {ax});
      const Array<T> row_alive = xt::cast<T>(xt::amax(p, std::array<std::size_t, 1>{ax}, keep) > T(0));
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
    // where(mask, fill, from), by runs of the mask broadcast to the input's shape.
    auto where = [sx, sm, mask](T fill, const Array<T>& from) {
      Array<T> out = Array<T>::from_shape(sx);
      const bool* m = mask.data();
      const T* f = from.data();
      T* o = out.data();
      detail::for_each_run(sx, sm, [&](std::size_t at, std::size_t in, std::size_t n) {
        for (std::size_t k = 0; k < n; ++k) o[at + k] = m[in + k] ? fill : f[at + k];
      });
      return out;
    };
    Array<T> y = where(static_cast<T>(value), x.value<T>());
    return record_op<T>("masked_fill", std::move(y), {&x}, [where = std::move(where)](BackwardContext<T>& ctx) {
      ctx.accumulate(0, where(T(0), ctx.grad()));
    }, Save::nothing, /*infinite_inputs=*/!std::isfinite(value));
  });
}

}  // namespace qkv
