#pragma once
// Hook points, named as TransformerLens names them: activations a forward pass reaches, each of
// which forward hooks may read or replace (for ablation and activation patching), and which a
// model's run_with_cache collects.
//
//   model.add_hook("blocks.1.attn.hook_z", [](const Tensor& z, const std::string&) {
//     return z * head_mask;  // z is (B, T, H, d_v): zero one head's output
//   });
//
// A hook returns the value the model goes on with: the one it was given, or a new tensor of the
// same shape and dtype (never the given one changed in place: autograd and a cache hold it).
// Gradients flow through whatever it returns.
//
// A module declares each point once, as a member it registers under a local name
// (Module::register_hook("hook_q", hook_q)) and runs in its forward (`q = hook_q(q)`); the point's
// full name is the module's path in the model and that local name ("blocks.0.attn.hook_q"), the
// same path its weights have ("blocks.0.attn.q_proj.weight").
#include <cstddef>
#include <functional>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "qkv/core/tensor.hpp"

namespace qkv::nn {

// Sees an activation and the full name of its hook point ("blocks.0.attn.hook_z").
using ForwardHook = std::function<Tensor(const Tensor& value, const std::string& name)>;
// Hooks by the names of their points, as run_with_hooks takes them.
using NamedHooks = std::vector<std::pair<std::string, ForwardHook>>;

// One hook point and the hooks added to it, which run in the order they were added.
class HookPoint {
 public:
  HookPoint() = default;
  HookPoint(const HookPoint&) = delete;
  HookPoint& operator=(const HookPoint&) = delete;

  // `value` through the hooks, in order. Throws std::invalid_argument naming the point and both
  // shapes when a hook changes the shape or dtype.
  Tensor operator()(Tensor value) const;
  // The full name: the owning module's path and the point's local name.
  const std::string& name() const { return name_; }

  void add(ForwardHook hook);  // std::invalid_argument for an empty function
  void clear() { hooks_.clear(); }
  bool empty() const { return hooks_.empty(); }
  // The number of hooks added, and a cut back to the first `n` of them (removing the later ones).
  std::size_t size() const { return hooks_.size(); }
  void truncate(std::size_t n) noexcept {
    if (n < hooks_.size()) hooks_.resize(n);
  }

 private:
  friend class Module;
  std::string name_;
  std::vector<ForwardHook> hooks_;
};

// Which hook points run_with_cache keeps: all (the default), those whose names a predicate
// accepts, or a list of names, each of which must be one of the model's points (else
// std::invalid_argument naming it).
class HookFilter {
 public:
  HookFilter() = default;
  template <class F>
    requires std::is_invocable_r_v<bool, const F&, const std::string&>
  HookFilter(F keep) : keep_(std::move(keep)) {}  // NOLINT: implicit, as a lambda is passed
  HookFilter(std::vector<std::string> names) : names_(std::move(names)), by_name_(true) {}  // NOLINT
  HookFilter(std::initializer_list<std::string> names) : names_(names), by_name_(true) {}

  // Whether the point `name` is kept.
  bool keeps(const std::string& name) const;
  // std::invalid_argument naming `owner` and the first listed name that is not in `points`.
  void check(const std::vector<std::string>& points, std::string_view owner) const;

 private:
  std::function<bool(const std::string&)> keep_;
  std::vector<std::string> names_;
  bool by_name_ = false;
};

// Activations by the names of their hook points, in the order a forward reached them, detached
// from the graph: what run_with_cache keeps (with the forward's output, in each model's cache).
struct Activations {
  std::vector<std::pair<std::string, Tensor>> activations;
  // The activation at hook point `name`; std::invalid_argument naming it when there is none.
  const Tensor& operator[](const std::string& name) const;
  bool contains(const std::string& name) const;
};

}  // namespace qkv::nn
