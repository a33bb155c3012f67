// reshape, permute/transpose, slice, concat, split: moves of elements, so each backward moves the
// gradient back the way the forward moved the value.
#include <algorithm>
#include <numeric>

#include <xtensor/xmanipulation.hpp>

#include <fmt/ranges.h>

#include "qkv/core/detail/kernels.hpp"
#include "qkv/core/detail/op.hpp"
#include "qkv/core/ops.hpp"

namespace qkv {

namespace {

// A row-major shape seen around one axis: `outer` rows (the dimensions before it) of `width`
// elements, and `inner` elements per index along the axis (the dimensions after it). A range
// [lo, hi) along the axis is then the columns [lo·inner, hi·inner) of every row.
struct AroundAxis {
  std::size_t outer = 1, inner = 1, width;
  AroundAxis(const Shape& s, std::size_t axis) {
    for (std::size_t d = 0; d < axis; ++d) outer *= s[d];
    for (std::size_t d = axis + 1; d < s.size(); ++d) inner *= s[d];
    width = s[axis] * inner;
  }
};

// For each of `rows` rows, `count` elements from src (rows of src_width, from column src_col) to
// dst (rows of dst_width, from column dst_col).
template <class T>
void copy_columns(const T* src, std::size_t src_width, std::size_t src_col, T* dst, std::size_t dst_width,
                  std::size_t dst_col, std::size_t rows, std::size_t count) {
  for (std::size_t r = 0; r < rows; ++r)
    std::copy(src + r * src_width + src_col, src + r * src_width + src_col + count, dst + r * dst_width + dst_col);
}

}  // namespace

Tensor reshape(const Tensor& x, const std::vector<std::int64_t>& shape) {
  check_inputs("reshape", {&x});
  const Shape sx = x.shape();
  Shape out(shape.size());
  std::size_t known = 1, infer = shape.size();
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1 && infer == shape.size()) {
      infer = i;
    } else if (shape[i] < 0) {
      fail("reshape", "{} to ({}): only one dimension may be -1, and none below it", to_string(sx),
           fmt::join(shape, ","));
    } else {
      out[i] = static_cast<std::size_t>(shape[i]);
      known *= out[i];
    }
  }
  if (infer < shape.size()) {
    if (known == 0 || numel(sx) % known != 0)
      fail("reshape", "cannot infer the -1 in ({}) for {} elements of shape {}", fmt::join(shape, ","),
           numel(sx), to_string(sx));
    out[infer] = numel(sx) / known;
  } else if (known != numel(sx)) {
    fail("reshape", "{} has {} elements; ({}) has {}", to_string(sx), numel(sx), fmt::join(shape, ","), known);
  }
  return dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    Array<T> y = x.value<T>();
    y.reshape(out);
    return record_op<T>("reshape", std::move(y), {&x}, [sx](BackwardContext<T>& ctx) {
      Array<T> g = ctx.grad();  // a copy, reshaped: the same elements in the same order
      g.reshape(sx);
      ctx.accumulate(0, std::move(g));
    });
  });
}

namespace {

// Whether `perm` swaps the last two axes and keeps the others in place: a batch of transposes.
bool swaps_last_two(const std::vector<std::size_t>& perm) {
  const std::size_t nd = perm.size();
  if (nd < 2 || perm[nd - 1] != nd - 2 || perm[nd - 2] != nd - 1) return false;
  for (std::size_t d = 0; d + 2 < nd; ++d)
    if (perm[d] != d) return false;
  return true;
}

// x with its axes in the order `perm` (a permutation), as a new array. When the last axis stays
// last (attention's head splits), by a copy of each row; when the last two swap (a key's
// transpose), by a transpose of each matrix; otherwise by xtensor's transpose.
template <class T>
Array<T> permuted(const Array<T>& x, const std::vector<std::size_t>& perm) {
  const std::size_t nd = perm.size();
  const Shape sx = to_shape(x.shape());
  if (swaps_last_two(perm)) {
    Shape sy = sx;
    std::swap(sy[nd - 1], sy[nd - 2]);
    Array<T> y = Array<T>::from_shape(sy);
    const std::size_t rows = sx[nd - 2], cols = sx[nd - 1], size = rows * cols;
    if (size > 0)
      for (std::size_t b = 0; b < x.size() / size; ++b) detail::transpose_small(x.data() + b * size, rows, cols, cols, y.data() + b * size);
    return y;
  }
  if (nd < 2 || perm.back() != nd - 1) return xt::transpose(x, perm);
  Shape sy(nd);
  for (std::size_t d = 0; d < nd; ++d) sy[d] = sx[perm[d]];
  Array<T> y = Array<T>::from_shape(sy);
  const std::size_t row = sy[nd - 1];
  if (y.size() == 0 || row == 0) return y;
  std::vector<std::size_t> stride(nd, 1), source(nd - 1), index(nd - 1, 0);
  for (std::size_t d = nd - 1; d-- > 0;) stride[d] = stride[d + 1] * sx[d + 1];
  for (std::size_t d = 0; d + 1 < nd; ++d) source[d] = stride[perm[d]];  // x's stride of y's axis d
  const T* from = x.data();
  T* to = y.data();
  std::size_t offset = 0;
  for (std::size_t r = 0, rows = y.size() / row; r < rows; ++r) {
    std::copy_n(from + offset, row, to + r * row);
    for (std::size_t d = nd - 1; d-- > 0;) {  // the next row of y, and where it is in x
      offset += source[d];
      if (++index[d] < sy[d]) break;
      offset -= source[d] * index[d];
      index[d] = 0;
    }
  }
  return y;
}

}  // namespace

Tensor permute(const Tensor& x, const std::vector<std::int64_t>& dims) {
  check_inputs("permute", {&x});
  const std::size_t ndim = x.dim();
  if (dims.size() != ndim)
    fail("permute", "{} dims ({}) for a tensor of shape {}", dims.size(), fmt::join(dims, ","), to_string(x.shape()));
  std::vector<std::size_t> perm(ndim), inverse(ndim, ndim);
  for (std::size_t i = 0; i < ndim; ++i) {
    perm[i] = normalize_axis("permute", dims[i], ndim);
    if (inverse[perm[i]] != ndim) fail("permute", "({}) is not a permutation: axis {} repeats", fmt::join(dims, ","), perm[i]);
    inverse[perm[i]] = i;
  }
  return dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    return record_op<T>("permute", permuted(x.value<T>(), perm), {&x}, [inverse](BackwardContext<T>& ctx) {
      ctx.accumulate(0, permuted(ctx.grad(), inverse));
    });
  });
}

Tensor transpose(const Tensor& x, std::int64_t dim0, std::int64_t dim1) {
  check_inputs("transpose", {&x});
  const std::size_t ndim = x.dim();
  std::vector<std::int64_t> dims(ndim);
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[normalize_axis("transpose", dim0, ndim)], dims[normalize_axis("transpose", dim1, ndim)]);
  return permute(x, dims);
}

Tensor slice(const Tensor& x, std::int64_t axis, std::int64_t start, std::int64_t stop) {
  check_inputs("slice", {&x});
  const Shape sx = x.shape();
  const std::size_t ax = normalize_axis("slice", axis, sx.size());
  const auto n = static_cast<std::int64_t>(sx[ax]);
  const std::int64_t lo = start < 0 ? start + n : start, hi = stop < 0 ? stop + n : stop;
  if (lo < 0 || hi > n || lo > hi)
    fail("slice", "[{}, {}) is out of bounds for axis {} of size {} in shape {}", start, stop, ax, n, to_string(sx));
  Shape sy = sx;
  sy[ax] = std::size_t(hi - lo);
  const AroundAxis a(sx, ax);
  const std::size_t first = std::size_t(lo) * a.inner, count = sy[ax] * a.inner;
  return dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    Array<T> y = Array<T>::from_shape(sy);
    copy_columns(x.value<T>().data(), a.width, first, y.data(), count, 0, a.outer, count);
    return record_op<T>("slice", std::move(y), {&x}, [sx, a, first, count](BackwardContext<T>& ctx) {
      Array<T> g = xt::zeros<T>(sx);
      copy_columns(ctx.grad().data(), count, 0, g.data(), a.width, first, a.outer, count);
      ctx.accumulate(0, std::move(g));
    });
  });
}

Tensor concat(const std::vector<Tensor>& xs, std::int64_t axis) {
  if (xs.empty()) fail("concat", "no tensors to concatenate");
  std::vector<const Tensor*> inputs;
  for (const Tensor& x : xs) inputs.push_back(&x);
  check_inputs("concat", inputs);
  const Shape first = xs[0].shape();
  const std::size_t ax = normalize_axis("concat", axis, first.size());
  Shape out = first;
  out[ax] = 0;
  std::vector<std::size_t> starts;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    Shape s = xs[i].shape();
    Shape a = s, b = first;
    if (s.size() == first.size()) a[ax] = b[ax] = 0;
    if (a != b)
      fail("concat", "tensor {} has shape {} but tensor 0 has {}: all but axis {} must match", i, to_string(s),
           to_string(first), ax);
    starts.push_back(out[ax]);
    out[ax] += s[ax];
  }
  starts.push_back(out[ax]);
  const AroundAxis a(out, ax);
  std::vector<Shape> shapes;
  for (const Tensor& x : xs) shapes.push_back(x.shape());
  return dispatch(xs[0].dtype(), [&](auto t) {
    using T = decltype(t);
    Array<T> y = Array<T>::from_shape(out);
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const std::size_t count = (starts[i + 1] - starts[i]) * a.inner;
      copy_columns(xs[i].value<T>().data(), count, 0, y.data(), a.width, starts[i] * a.inner, a.outer, count);
    }
    return record_op<T>("concat", std::move(y), inputs, [starts, shapes, a](BackwardContext<T>& ctx) {
      for (std::size_t i = 0; i + 1 < starts.size(); ++i) {
        if (!ctx.needs(i)) continue;
        const std::size_t count = (starts[i + 1] - starts[i]) * a.inner;
        Array<T> g = Array<T>::from_shape(shapes[i]);
        copy_columns(ctx.grad().data(), a.width, starts[i] * a.inner, g.data(), count, 0, a.outer, count);
        ctx.accumulate(i, std::move(g));
      }
    });
  });
}

std::vector<Tensor> split(const Tensor& x, const std::vector<std::size_t>& sizes, std::int64_t axis) {
  check_inputs("split", {&x});
  const std::size_t ax = normalize_axis("split", axis, x.dim());
  const std::size_t total = std::accumulate(sizes.begin(), sizes.end(), std::size_t(0));
  if (total != x.size(std::int64_t(ax)))
    fail("split", "sizes ({}) add up to {} but axis {} of shape {} has {}", fmt::join(sizes, ","), total, ax,
         to_string(x.shape()), x.size(std::int64_t(ax)));
  std::vector<Tensor> pieces;
  std::int64_t start = 0;
  for (std::size_t s : sizes) {
    pieces.push_back(slice(x, std::int64_t(ax), start, start + std::int64_t(s)));
    start += std::int64_t(s);
  }
  return pieces;
}

std::vector<Tensor> split(const Tensor& x, std::size_t split_size, std::int64_t axis) {
  check_inputs("split", {&x});
  if (split_size == 0) fail("split", "split_size must be positive");
  const std::size_t n = x.size(axis);
  std::vector<std::size_t> sizes;
  for (std::size_t start = 0; start < n; start += split_size) sizes.push_back(std::min(split_size, n - start));
  return split(x, sizes, axis);
}

}  // namespace qkv
