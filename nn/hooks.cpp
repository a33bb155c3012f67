#include "qkv/nn/hooks.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "qkv/core/shape.hpp"

namespace qkv::nn {

HookPoints::HookPoints(std::vector<std::string> names, std::string prefix)
    : local_(std::move(names)), prefix_(std::move(prefix)) {}

std::vector<std::string> HookPoints::names() const {
  std::vector<std::string> out;
  for (const std::string& n : local_) out.push_back(prefix_ + n);
  return out;
}

bool HookPoints::has(const std::string& name) const {
  return name.starts_with(prefix_) &&
         std::find(local_.begin(), local_.end(), name.substr(prefix_.size())) != local_.end();
}

void HookPoints::add(const std::string& name, ForwardHook hook) {
  if (!has(name)) fail("hooks", "no hook point '{}' (these are: {})", name, fmt::join(names(), ", "));
  if (!hook) fail("hooks", "an empty hook for '{}'", name);
  hooks_.emplace_back(name.substr(prefix_.size()), std::move(hook));
}

Tensor HookPoints::run(std::string_view local, Tensor value) const {
  for (const auto& [point, hook] : hooks_) {
    if (point != local) continue;
    const std::string name = prefix_ + point;
    Tensor out = hook(value, name);
    if (!out.defined() || out.shape() != value.shape() || out.dtype() != value.dtype())
      fail("hooks", "the hook on '{}' returned {}, where the point holds {} {}", name,
           out.defined() ? fmt::format("{} {}", dtype_name(out.dtype()), to_string(out.shape())) : "no tensor",
           dtype_name(value.dtype()), to_string(value.shape()));
    value = std::move(out);
  }
  return value;
}

void add_hook(const std::vector<HookPoints*>& points, const std::string& name, ForwardHook hook, std::string_view owner,
              const std::vector<std::string>& names) {
  for (HookPoints* p : points)
    if (p->has(name)) return p->add(name, std::move(hook));
  fail(owner, "no hook point '{}'; this model has {}", name, fmt::join(names, ", "));
}

}  // namespace qkv::nn
