#include "qkv/optim/sgd.hpp"

#include <cmath>

namespace qkv::optim {

SGD::SGD(std::vector<Tensor> params, const SGDOptions& o) : Optimizer(std::move(params), o.lr), options_(o) {
  if (!(o.momentum >= 0)) fail("SGD", "invalid momentum {}", o.momentum);
  if (!(o.weight_decay >= 0)) fail("SGD", "invalid weight_decay {}", o.weight_decay);
  if (!(o.dampening >= 0 && o.dampening <= 1)) fail("SGD", "invalid dampening {}", o.dampening);
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
    fail("SGD", "nesterov needs momentum > 0 and dampening = 0 (got momentum {}, dampening {})", o.momentum, o.dampening);
}

void SGD::update(std::size_t i, Tensor& param, const Tensor& grad) {
  const auto& o = options_;
  const bool first = !has_buffer(i, "momentum_buffer");
  Tensor buf = o.momentum != 0 ? buffer(i, "momentum_buffer") : Tensor();
  ++step_count(i);
  const auto run = [&](auto tag) {
    using T = decltype(tag);
    T* p = param.mutable_value<T>().data();
    const T* g = grad.value<T>().data();
    T* b = buf.defined() ? buf.mutable_value<T>().data() : nullptr;
    const T lr = T(this->lr()), wd = T(o.weight_decay), m = T(o.momentum), damp = T(o.dampening);
    for (std::size_t j = 0, n = param.numel(); j < n; ++j) {
      T d = wd != 0 ? g[j] + wd * p[j] : g[j];
      if (b) {
        b[j] = first ? d : b[j] * m + (T(1) - damp) * d;
        d = o.nesterov ? d + m * b[j] : b[j];
      }
      p[j] -= lr * d;
    }
  };
  param.dtype() == DType::float32 ? run(float{}) : run(double{});
}

}  // namespace qkv::optim
