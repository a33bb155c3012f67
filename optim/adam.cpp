#include "optim/adam.hpp"

#include <cmath>

namespace qkv::optim {

Adam::Adam(std::vector<Tensor> params, const AdamOptions& options) : Adam(std::move(params), options, false) {}

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options) : Adam(std::move(params), options, true) {}

Adam::Adam(std::vector<Tensor> params, const AdamOptions& o, bool decoupled)
    : Optimizer(std::move(params), o.lr), options_(o), decoupled_(decoupled) {
  const char* who = decoupled ? "AdamW" : "Adam";
  if (!(o.beta1 >= 0 && o.beta1 < 1)) fail(who, "invalid beta1 {}: it must be in [0, 1)", o.beta1);
  if (!(o.beta2 >= 0 && o.beta2 < 1)) fail(who, "invalid beta2 {}: it must be in [0, 1)", o.beta2);
  if (!(o.eps > 0)) fail(who, "invalid eps {}: it must be positive", o.eps);
  if (!(o.weight_decay >= 0)) fail(who, "invalid weight_decay {}: it must be non-negative", o.weight_decay);
}

void Adam::update(std::size_t i, Tensor& param, const Tensor& grad) {
  const auto& o = options_;
  Tensor m_buf = buffer(i, "exp_avg"), v_buf = buffer(i, "exp_avg_sq");
  Tensor vmax_buf = o.amsgrad ? buffer(i, "max_exp_avg_sq") : Tensor();
  const double t = ++step_count(i);
  const double lr = this->lr();
  const double step_size = lr / (1 - std::pow(o.beta1, t));
  const double bias_correction2_sqrt = std::sqrt(1 - std::pow(o.beta2, t));
  const auto run = [&](auto tag) {
    using T = decltype(tag);
    T* p = param.mutable_value<T>().data();
    const T* g = grad.value<T>().data();
    T* m = m_buf.mutable_value<T>().data();
    T* v = v_buf.mutable_value<T>().data();
    T* vmax = vmax_buf.defined() ? vmax_buf.mutable_value<T>().data() : nullptr;
    const T b1 = T(o.beta1), b2 = T(o.beta2), wd = T(o.weight_decay), eps = T(o.eps);
    for (std::size_t j = 0, n = param.numel(); j < n; ++j) {
      T gj = g[j];
      if (decoupled_)
        p[j] *= T(1 - lr * o.weight_decay);
      else if (wd != 0)
        gj += wd * p[j];
      m[j] = m[j] * b1 + gj * (T(1) - b1);
      v[j] = v[j] * b2 + gj * gj * (T(1) - b2);
      T second = v[j];
      if (vmax) second = vmax[j] = std::max(vmax[j], v[j]);
      const T denom = std::sqrt(second) / T(bias_correction2_sqrt) + eps;
      p[j] -= T(step_size) * m[j] / denom;
    }
  };
  param.dtype() == DType::float32 ? run(float{}) : run(double{});
}

}  // namespace qkv::optim
