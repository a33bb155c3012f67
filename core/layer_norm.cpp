// layer_norm over the last dimension, with optional affine weight and bias (D).
#include <cmath>

#include "qkv/core/detail/op.hpp"
#include "qkv/core/ops.hpp"

namespace qkv {

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  std::vector<const Tensor*> given{&x};
  for (const Tensor* p : {&weight, &bias})
    if (p->defined()) given.push_back(p);
  check_inputs("layer_norm", given);
  const Shape sx = x.shape();
  if (sx.empty()) fail("layer_norm", "the input needs at least one dimension, got shape ()");
  const std::size_t D = sx.back(), N = numel(sx) / std::max<std::size_t>(D, 1);
  for (const Tensor* p : {&weight, &bias})
    if (p->defined() && p->shape() != Shape{D})
      fail("layer_norm", "{} has shape {} but the input {} needs ({})", p == &weight ? "weight" : "bias",
           to_string(p->shape()), to_string(sx), D);
  if (!(eps > 0)) fail("layer_norm", "eps must be positive, got {}", eps);
  return dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    // x is (N, D) in rows; y = (x − mean) · rstd · w + b with rstd = 1/√(var + eps), var biased.
    const T* xv = x.value<T>().data();
    const T* w = weight.defined() ? weight.value<T>().data() : nullptr;
    const T* b = bias.defined() ? bias.value<T>().data() : nullptr;
    Array<T> y = Array<T>::from_shape(sx);
    std::vector<T> row_mean(N), rstd(N);
    detail::layer_norm_rows(xv, N, D, w, b, T(eps), y.data(), row_mean.data(), rstd.data());
    return record_op<T>("layer_norm", std::move(y), {&x, &weight, &bias},
                        [x, weight, row_mean = std::move(row_mean), rstd = std::move(rstd), N, D](BackwardContext<T>& ctx) {
      // With ĝ = dy ⊙ w: dx = rstd · (ĝ − mean(ĝ) − x̂ · mean(ĝ ⊙ x̂)); dw = Σ_rows dy ⊙ x̂; db = Σ_rows dy.
      const T* g = ctx.grad().data();
      Array<T> dx = Array<T>::from_shape(x.shape());
      Array<T> g_xhat = Array<T>::from_shape(ctx.needs(1) ? x.shape() : Shape{0});  // dy ⊙ x̂, for dw
      detail::layer_norm_backward_rows(x.value<T>().data(), g, N, D, weight.defined() ? weight.value<T>().data() : nullptr,
                                       row_mean.data(), rstd.data(), dx.data(), ctx.needs(1) ? g_xhat.data() : nullptr);
      ctx.accumulate(0, std::move(dx));
      const auto down_rows = [&](const T* rows) {  // (N, D) summed over N
        Array<T> summed = xt::zeros<T>(Shape{D});
        detail::add_column_sums(rows, N, D, summed.data());
        return summed;
      };
      if (ctx.needs(1)) ctx.accumulate(1, down_rows(g_xhat.data()));
      if (ctx.needs(2)) ctx.accumulate(2, down_rows(g));
    });
  });
}

}  // namespace qkv
