#include "qkv/optim/adam.hpp"

#include <algorithm>
#include <cmath>

#include "qkv/core/detail/target_clones.hpp"

namespace qkv::optim {

Adam::Adam(std::vector<Tensor> params, const AdamOptions& options) : Adam(std::move(params), options, false) {}

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& o)
    : Adam(std::move(params), {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.amsgrad}, true) {}

Adam::Adam(std::vector<Tensor> params, const AdamOptions& o, bool decoupled)
    : Optimizer(std::move(params), o.lr), options_(o), decoupled_(decoupled) {
  const char* who = decoupled ? "AdamW" : "Adam";
  if (!(o.beta1 >= 0 && o.beta1 < 1)) fail(who, "invalid beta1 {}: it must be in [0, 1)", o.beta1);
  if (!(o.beta2 >= 0 && o.beta2 < 1)) fail(who, "invalid beta2 {}: it must be in [0, 1)", o.beta2);
  if (!(o.eps > 0)) fail(who, "invalid eps {}: it must be positive", o.eps);
  if (!(o.weight_decay >= 0)) fail(who, "invalid weight_decay {}: it must be non-negative", o.weight_decay);
}

std::vector<std::string> Adam::buffer_names() const {
  if (options_.amsgrad) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return {"exp_avg", "exp_avg_sq"};
}

namespace {

struct Coefficients {
  double b1, b2, eps, weight_decay, decay_factor, step_size, bias_correction2_sqrt;
  bool decoupled;
};

// One Adam step over n elements, compiled for AVX-512, AVX2 and the baseline and chosen when the
// program loads; with no multiply-add fused, every version computes the same bits.
template <class T>
[[gnu::always_inline]] inline void adam_loop(T* p, const T* g, T* m, T* v, T* vmax, std::size_t n,
                                             const Coefficients& c) {
  // 1 − β in double, then rounded, as torch.optim does: in float32, 1 − 0.999 would be 0.0009999871.
  const T b1 = T(c.b1), b2 = T(c.b2), one_minus_b1 = T(1 - c.b1), one_minus_b2 = T(1 - c.b2);
  const T wd = T(c.weight_decay), eps = T(c.eps), decay = T(c.decay_factor);
  const T step_size = T(c.step_size), bias_correction2_sqrt = T(c.bias_correction2_sqrt);
  for (std::size_t j = 0; j < n; ++j) {
    T gj = g[j];
    if (c.decoupled)
      p[j] *= decay;
    else if (wd != 0)
      gj += wd * p[j];
    m[j] = m[j] * b1 + one_minus_b1 * gj;
    v[j] = v[j] * b2 + one_minus_b2 * gj * gj;  // torch's addcmul: (value · g) · g
    T second = v[j];
    if (vmax) second = vmax[j] = std::max(vmax[j], v[j]);
    const T denom = std::sqrt(second) / bias_correction2_sqrt + eps;
    p[j] -= step_size * m[j] / denom;
  }
}

QKV_CLONES void adam_update(float* p, const float* g, float* m, float* v, float* vmax, std::size_t n,
                            const Coefficients& c) {
  adam_loop(p, g, m, v, vmax, n, c);
}
QKV_CLONES void adam_update(double* p, const double* g, double* m, double* v, double* vmax, std::size_t n,
                            const Coefficients& c) {
  adam_loop(p, g, m, v, vmax, n, c);
}

}  // namespace

void Adam::update(std::size_t i, Tensor& param, const Tensor& grad) {
  const auto& o = options_;
  Tensor m_buf = buffer(i, "exp_avg"), v_buf = buffer(i, "exp_avg_sq");
  Tensor vmax_buf = o.amsgrad ? buffer(i, "max_exp_avg_sq") : Tensor();
  const double t = ++step_count(i);
  const double lr = this->lr();
  const Coefficients c{o.beta1, o.beta2, o.eps, o.weight_decay, 1 - lr * o.weight_decay,
                       lr / (1 - std::pow(o.beta1, t)), std::sqrt(1 - std::pow(o.beta2, t)), decoupled_};
  const auto run = [&](auto tag) {
    using T = decltype(tag);
    adam_update(param.mutable_value<T>().data(), grad.value<T>().data(), m_buf.mutable_value<T>().data(),
                v_buf.mutable_value<T>().data(), vmax_buf.defined() ? vmax_buf.mutable_value<T>().data() : nullptr,
                param.numel(), c);
  };
  param.dtype() == DType::float32 ? run(float{}) : run(double{});
}

}  // namespace qkv::optim
