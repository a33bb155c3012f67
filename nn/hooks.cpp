#include "qkv/nn/hooks.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "qkv/core/shape.hpp"

namespace qkv::nn {

void HookPoint::add(ForwardHook hook) {
  if (!hook) fail("hooks", "an empty hook for '{}'", name_);
  hooks_.push_back(std::move(hook));
}

Tensor HookPoint::operator()(Tensor value) const {
  for (const ForwardHook& hook : hooks_) {
    Tensor out = hook(value, name_);
    if (!out.defined() || out.shape() != value.shape() || out.dtype() != value.dtype())
      fail("hooks", "the hook on '{}' returned {}, where the point holds {} {}", name_,
           out.defined() ? fmt::format("{} {}", dtype_name(out.dtype()), to_string(out.shape())) : "no tensor",
           dtype_name(value.dtype()), to_string(value.shape()));
    value = std::move(out);
  }
  return value;
}

bool HookFilter::keeps(const std::string& name) const {
  if (by_name_) return std::find(names_.begin(), names_.end(), name) != names_.end();
  return !keep_ || keep_(name);
}

void HookFilter::check(const std::vector<std::string>& points, std::string_view owner) const {
  for (const std::string& name : names_)
    if (std::find(points.begin(), points.end(), name) == points.end())
      fail(owner, "no hook point '{}'; this model has {}", name, fmt::join(points, ", "));
}

const Tensor& Activations::operator[](const std::string& name) const {
  for (const auto& [point, value] : activations)
    if (point == name) return value;
  std::vector<std::string> names;
  for (const auto& a : activations) names.push_back(a.first);
  fail("ActivationCache", "no activation '{}' (it has {})", name, fmt::join(names, ", "));
}

bool Activations::contains(const std::string& name) const {
  return std::any_of(activations.begin(), activations.end(), [&](const auto& a) { return a.first == name; });
}

}  // namespace qkv::nn
