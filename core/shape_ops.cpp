// reshape, permute/transpose, slice, concat, split: moves of elements, so each backward moves the
// gradient back the way the forward moved the value.
#include <numeric>

#include <xtensor/xmanipulation.hpp>
#include <xtensor/xstrided_view.hpp>

#include <fmt/ranges.h>

#include "core/detail/op.hpp"
#include "core/ops.hpp"

namespace qkv {

namespace {

// Slices selecting [start, stop) along `axis` and everything along the other axes.
xt::xstrided_slice_vector axis_range(std::size_t ndim, std::size_t axis, std::size_t start, std::size_t stop) {
  xt::xstrided_slice_vector sv(ndim, xt::all());
  sv[axis] = xt::range(start, stop);
  return sv;
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
      ctx.accumulate(0, xt::reshape_view(ctx.grad(), sx));
    });
  });
}

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
    Array<T> y = xt::transpose(x.value<T>(), perm);
    return record_op<T>("permute", std::move(y), {&x}, [inverse](BackwardContext<T>& ctx) {
      ctx.accumulate(0, xt::transpose(ctx.grad(), inverse));
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
  const auto sv = axis_range(sx.size(), ax, std::size_t(lo), std::size_t(hi));
  return dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    Array<T> y = xt::strided_view(x.value<T>(), sv);
    return record_op<T>("slice", std::move(y), {&x}, [sx, sv](BackwardContext<T>& ctx) {
      Array<T> g = xt::zeros<T>(sx);
      xt::strided_view(g, sv) = ctx.grad();
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
  return dispatch(xs[0].dtype(), [&](auto t) {
    using T = decltype(t);
    Array<T> y = Array<T>::from_shape(out);
    for (std::size_t i = 0; i < xs.size(); ++i)
      xt::strided_view(y, axis_range(out.size(), ax, starts[i], starts[i + 1])) = xs[i].value<T>();
    return record_op<T>("concat", std::move(y), inputs, [starts, ax](BackwardContext<T>& ctx) {
      const std::size_t ndim = ctx.grad().dimension();
      for (std::size_t i = 0; i + 1 < starts.size(); ++i)
        if (ctx.needs(i)) ctx.accumulate(i, xt::strided_view(ctx.grad(), axis_range(ndim, ax, starts[i], starts[i + 1])));
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
