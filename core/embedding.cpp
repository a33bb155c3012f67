// embedding: gather rows of a (V, D) table; backward scatter-adds into the rows it read.
#include <algorithm>

#include "qkv/core/detail/blas.hpp"
#include "qkv/core/detail/op.hpp"
#include "qkv/core/ops.hpp"

namespace qkv {

Tensor embedding(const Tensor& weight, const IndexArray& indices) {
  check_inputs("embedding", {&weight});
  const Shape sw = weight.shape();
  if (sw.size() != 2) fail("embedding", "weight must be (V, D), got {}", to_string(sw));
  const std::size_t V = sw[0], D = sw[1];
  for (std::size_t i = 0; i < indices.size(); ++i) {
    const std::int64_t id = indices.data()[i];
    if (id < 0 || id >= std::int64_t(V))
      fail("embedding", "index {} at flat position {} is out of range for a table of {} rows", id, i, V);
  }
  Shape out = to_shape(indices.shape());
  out.push_back(D);
  return dispatch(weight.dtype(), [&](auto t) {
    using T = decltype(t);
    // out is (..., D): row i is weight[indices[i]].
    Array<T> y = Array<T>::from_shape(out);
    const T* w = weight.value<T>().data();
    const std::int64_t* ids = indices.data();
    detail::parallel_rows(indices.size(), D, [&](std::size_t lo, std::size_t hi) {
      for (std::size_t i = lo; i < hi; ++i) std::copy_n(w + ids[i] * D, D, y.data() + i * D);
    });
    return record_op<T>("embedding", std::move(y), {&weight}, [indices, sw, D](BackwardContext<T>& ctx) {
      // Scatter-add, split across the pool by runs of columns: every element still sums the rows
      // that read it in their order, so the bits do not depend on the number of threads.
      Array<T> g = xt::zeros<T>(sw);
      const T* gy = ctx.grad().data();
      const std::int64_t* ids = indices.data();
      const std::size_t n = indices.size();
      detail::parallel_ranges(D, detail::column_run(n, D), [&](std::size_t lo, std::size_t hi) {
        for (std::size_t i = 0; i < n; ++i) {
          T* row = g.data() + ids[i] * D;
          for (std::size_t d = lo; d < hi; ++d) row[d] += gy[i * D + d];
        }
      });
      ctx.accumulate(0, std::move(g));
    });
  });
}

}  // namespace qkv
