#pragma once
// Adam and AdamW as torch.optim (1.13), step t counted per parameter:
//   g = g + weight_decay·p                      (Adam: L2 in the gradient)
//   p = p · (1 − lr·weight_decay)               (AdamW: decoupled, before the update)
//   m = β1·m + (1 − β1)·g,  v = β2·v + (1 − β2)·g²,  v̂max = max(v̂max, v) with amsgrad
//   p = p − lr/(1 − β1ᵗ) · m / (√v / √(1 − β2ᵗ) + eps)
// so eps is added to the bias-corrected √v̂.
#include "qkv/optim/optimizer.hpp"

namespace qkv::optim {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  bool amsgrad = false;
};

// The same fields, with torch.optim.AdamW's default weight decay; an aggregate, as AdamOptions, so
// that AdamW(params, {.lr = 3e-3}) compiles.
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, const AdamOptions& options);
  const AdamOptions& options() const { return options_; }

 protected:
  Adam(std::vector<Tensor> params, const AdamOptions& options, bool decoupled);
  void update(std::size_t i, Tensor& param, const Tensor& grad) override;
  std::vector<std::string> buffer_names() const override;
  std::vector<std::string> nonnegative_buffers() const override { return {"exp_avg_sq", "max_exp_avg_sq"}; }

 private:
  AdamOptions options_;
  bool decoupled_;  // AdamW
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, const AdamWOptions& options);
};

}  // namespace qkv::optim
