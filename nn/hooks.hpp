#pragma once
// Hook points, named as TransformerLens names them: activations a forward pass reaches, each of
// which forward hooks may read or replace (for ablation and activation patching), and which
// Transformer::run_with_cache collects.
//
//   model.add_hook("blocks.1.attn.hook_z", [](const Tensor& z, const std::string&) {
//     return z * head_mask;  // z is (B, T, H, d_v): zero one head's output
//   });
//
// A hook returns the value the model goes on with: the one it was given, or a new tensor of the
// same shape and dtype (never the given one changed in place: autograd and a cache hold it).
// Gradients flow through whatever it returns.
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "qkv/core/tensor.hpp"

namespace qkv::nn {

// Sees an activation and the full name of its hook point ("blocks.0.attn.hook_z").
using ForwardHook = std::function<Tensor(const Tensor& value, const std::string& name)>;

// The hook points of one module: a fixed list of names, and the hooks added to each, which run in
// the order they were added.
class HookPoints {
 public:
  explicit HookPoints(std::vector<std::string> names, std::string prefix = "");

  // The points' full names: the prefix ("blocks.0.attn.") and the local name ("hook_q").
  std::vector<std::string> names() const;
  const std::string& prefix() const { return prefix_; }
  void set_prefix(std::string prefix) { prefix_ = std::move(prefix); }
  // Whether `name` (full) is one of these points.
  bool has(const std::string& name) const;

  // Adds `hook` to the point `name` (full); std::invalid_argument naming it when it is not one.
  void add(const std::string& name, ForwardHook hook);
  void clear() { hooks_.clear(); }
  bool empty() const { return hooks_.empty(); }
  // The number of hooks added, and a cut back to the first `n` of them (removing the later ones).
  std::size_t size() const { return hooks_.size(); }
  void truncate(std::size_t n) noexcept {
    if (n < hooks_.size()) hooks_.erase(hooks_.begin() + std::ptrdiff_t(n), hooks_.end());
  }

  // `value` through the hooks of the point `local` ("hook_q"), in order. Throws
  // std::invalid_argument naming the point and both shapes when a hook changes the shape or dtype.
  Tensor run(std::string_view local, Tensor value) const;

 private:
  std::vector<std::string> local_;
  std::string prefix_;
  std::vector<std::pair<std::string, ForwardHook>> hooks_;  // by local name
};

// Adds `hook` to whichever of a model's `points` has the point `name`; std::invalid_argument
// naming the model (`owner`), the point and the model's points when none has.
void add_hook(const std::vector<HookPoints*>& points, const std::string& name, ForwardHook hook, std::string_view owner,
              const std::vector<std::string>& names);

}  // namespace qkv::nn
