#pragma once
// SGD with momentum, dampening, Nesterov and L2 weight decay, as torch.optim.SGD (1.13):
//   d = g + weight_decay·p
//   b = d at the first step, then momentum·b + (1 − dampening)·d
//   d = d + momentum·b (nesterov) or b (otherwise)
//   p = p − lr·d
#include "qkv/optim/optimizer.hpp"

namespace qkv::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;  // needs momentum > 0 and dampening = 0
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, const SGDOptions& options);
  const SGDOptions& options() const { return options_; }

 protected:
  void update(std::size_t i, Tensor& param, const Tensor& grad) override;
  std::vector<std::string> buffer_names() const override {
    return options_.momentum != 0 ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{};
  }

 private:
  SGDOptions options_;
};

}  // namespace qkv::optim
