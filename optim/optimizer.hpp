#pragma once
// Optimizer: updates a list of parameters (module.parameters(), or any tensors) from their
// gradients, with torch.optim 1.13's update rules. Parameters that do not require grad, or that
// have no gradient this step, are skipped, as in PyTorch.
#include <string>
#include <vector>

#include "qkv/core/tensor.hpp"

namespace qkv::optim {

class Optimizer {
 public:
  Optimizer(std::vector<Tensor> params, double lr);
  virtual ~Optimizer() = default;

  void zero_grad();  // to none, as set_to_none=True
  void step();

  double lr() const { return lr_; }
  void set_lr(double lr);
  const std::vector<Tensor>& params() const { return params_; }

  // lr and every parameter's state ("0.exp_avg", "0.step", …), as copies. The other
  // hyperparameters come from the constructor, as a checkpoint's config records them.
  StateDict state_dict() const;
  // Restores what state_dict saved: a resumed run then continues bit-identically. Throws
  // std::invalid_argument, changing nothing, for an unknown or repeated entry, a buffer of the
  // wrong shape or dtype, a value no run could have reached (NaN or infinite anywhere, negative in
  // a buffer of squares), or a parameter whose state is incomplete (a step count without each
  // buffer the optimizer keeps, or buffers without a step count).
  void load_state_dict(const StateDict& state);

 protected:
  // Updates parameter i, whose gradient is defined, in the parameter's dtype.
  virtual void update(std::size_t i, Tensor& param, const Tensor& grad) = 0;
  // The buffers, all of the parameter's shape, that each updated parameter has with these options.
  virtual std::vector<std::string> buffer_names() const = 0;
  // Those of them that hold averages of squares, and so are never negative.
  virtual std::vector<std::string> nonnegative_buffers() const { return {}; }

  // Parameter i's buffer `name` (a handle: writes reach the state), created as zeros on first
  // use; and its step count.
  Tensor buffer(std::size_t i, const std::string& name);
  bool has_buffer(std::size_t i, const std::string& name) const;
  double& step_count(std::size_t i) { return steps_[i]; }

 private:
  std::vector<Tensor> params_;
  double lr_;
  std::vector<StateDict> buffers_;  // per parameter
  std::vector<double> steps_;       // per parameter: updates so far
};

// Rescales all gradients together so that their global L2 norm is at most max_norm; returns the
// norm before clipping. As torch.nn.utils.clip_grad_norm_ (scale max_norm / (norm + 1e-6)), but a
// non-finite norm throws std::runtime_error instead of spreading NaN.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);
// Clamps every gradient element into [-clip_value, clip_value].
void clip_grad_value(const std::vector<Tensor>& params, double clip_value);

}  // namespace qkv::optim
