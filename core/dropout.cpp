// dropout: inverted (survivors scaled by 1/(1−p)), with its mask drawn from a seeded generator.
#include "qkv/core/detail/op.hpp"
#include "qkv/core/ops.hpp"

namespace qkv {

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  check_inputs("dropout", {&x});
  if (!(p >= 0 && p <= 1)) fail("dropout", "probability p must be in [0, 1], got {}", p);
  if (!training || p == 0) return x;
  return dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    const T keep_scale = p == 1 ? T(0) : T(1.0 / (1.0 - p));
    Array<T> mask = Array<T>::from_shape(x.shape());
    for (T& m : mask) m = gen.uniform() < p ? T(0) : keep_scale;
    Array<T> y = x.value<T>() * mask;
    return record_op<T>("dropout", std::move(y), {&x}, [mask = std::move(mask)](BackwardContext<T>& ctx) {
      ctx.accumulate(0, ctx.grad() * mask);
    });
  });
}

}  // namespace qkv
