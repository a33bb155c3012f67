#pragma once
// Module: a named tree of parameters, as torch.nn.Module.
//
//   class Mlp : public Module {
//    public:
//     Mlp() { register_module("fc", fc); }
//     Linear fc{4, 2};
//   };
//   Mlp m;  m.named_parameters()  ->  fc.weight (2,4), fc.bias (2)
//
// Parameters are Tensor handles held by the module that owns them; a tensor registered under two
// names (a tied weight) is one parameter, listed and saved once, under its first name.
// Submodules are members of their parent, so modules can be neither copied nor moved.
#include <string>
#include <utility>
#include <vector>

#include "qkv/core/tensor.hpp"

namespace qkv::nn {

// A module's StateDict lists names in registration order (depth first), as PyTorch's OrderedDict.
using qkv::StateDict;

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  StateDict named_parameters() const;
  std::vector<Tensor> parameters() const;

  // Every parameter, trainable or frozen, by name. The tensors are the parameters themselves.
  StateDict state_dict() const;
  // Copies the values of `state` into the parameters (converting the dtype). Throws one
  // std::invalid_argument listing every missing, unexpected and mis-shaped name; then nothing
  // has been changed.
  void load_state_dict(const StateDict& state);

  void train(bool mode = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Clears the gradient of every parameter (to none, as set_to_none=True).
  void zero_grad();
  // Converts every parameter to `dtype`, in place.
  void to(DType dtype);

 protected:
  // `tensor` is the module's own handle; it stays valid through to() and load_state_dict().
  void register_parameter(std::string name, const Tensor& tensor);
  void register_module(std::string name, Module& child);

 private:
  void collect(const std::string& prefix, StateDict& out) const;

  StateDict parameters_;
  std::vector<std::pair<std::string, Module*>> children_;
  bool training_ = true;
};

}  // namespace qkv::nn
