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
//
// Hook points (hooks.hpp) are registered the same way, in the order the forward reaches them
// among the submodules: a point's full name is the path of the module that holds it, as a
// parameter's is ("blocks.0.attn.hook_q" beside "blocks.0.attn.q_proj.weight").
#include <string>
#include <utility>
#include <vector>

#include "qkv/core/tensor.hpp"
#include "qkv/nn/hooks.hpp"

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

  // The full names of the module's hook points and its submodules', in the order a forward
  // reaches them.
  std::vector<std::string> hook_names() const;
  // Adds `hook` to the point `name`; std::invalid_argument naming the module, the name and its
  // points when it has no such point.
  void add_hook(const std::string& name, ForwardHook hook);
  // Removes every hook of every point.
  void reset_hooks();

 protected:
  // `tensor` is the module's own handle; it stays valid through to() and load_state_dict().
  void register_parameter(std::string name, const Tensor& tensor);
  // Registers `child` under `name`: its parameters and hook points are named `name.` and theirs.
  void register_module(std::string name, Module& child);
  // Registers the point, a member of this module, under the local `name` ("hook_q",
  // "ln1.hook_normalized").
  void register_hook(std::string name, HookPoint& point);
  // What the errors of add_hook and the caches name the module by ("Transformer").
  virtual const char* type_name() const { return "Module"; }

  // The result of `forward()`, run with `hooks` added to their points for the call only (after
  // the module's own); each point is cut back to the hooks it had however the call ends. A name
  // that is no point is an error before anything runs.
  template <class Forward>
  auto with_hooks(const NamedHooks& hooks, Forward&& forward) {
    const std::vector<HookPoint*> points = hook_points();  // one walk of the tree for every name
    const Restore restore(points);
    for (const auto& [name, hook] : hooks) add_hook(points, name, hook);
    return forward();
  }
  // Hooks that keep, detached, into `cache`, the activation of every point `filter` keeps; a name
  // the filter lists that is no point is an error.
  NamedHooks caching_hooks(Activations& cache, const HookFilter& filter) const;

 private:
  void collect(const std::string& prefix, StateDict& out) const;
  void collect_hooks(std::vector<HookPoint*>& out) const;
  std::vector<HookPoint*> hook_points() const;
  void add_hook(const std::vector<HookPoint*>& points, const std::string& name, ForwardHook hook) const;
  struct Restore {  // each point's number of hooks, put back on destruction
    explicit Restore(const std::vector<HookPoint*>& points);
    ~Restore();
    Restore(const Restore&) = delete;
    Restore& operator=(const Restore&) = delete;
    std::vector<std::pair<HookPoint*, std::size_t>> sizes;
  };

  StateDict parameters_;
  std::vector<std::pair<std::string, Module*>> children_;
  // Each point, and the number of children registered before it (its place among them).
  std::vector<std::pair<HookPoint*, std::size_t>> hooks_;
  bool training_ = true;
};

}  // namespace qkv::nn
