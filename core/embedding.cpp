// embedding: gather rows of a (V, D) table; backward scatter-adds into the rows it read.
#include <algorithm>

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
    for (std::size_t i = 0; i < indices.size(); ++i)
      std::copy_n(w + indices.data()[i] * D, D, y.data() + i * D);
    return record_op<T>("embedding", std::move(y), {&weight}, [indices, sw, D](BackwardContext<T>& ctx) {
      Array<T> g = xt::zeros<T>(sw);
      const T* gy = ctx.grad().data();
      for (std::size_t i = 0; i < indices.size(); ++i) {
        T* row = g.data() + indices.data()[i] * D;
        for (std::size_t d = 0; d < D; ++d) row[d] += gy[i * D + d];
      }
      ctx.accumulate(0, std::move(g));
    });
  });
}

}  // namespace qkv
