#include "qkv/nn/module.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace qkv::nn {

void Module::register_parameter(std::string name, const Tensor& tensor) {
  if (!tensor.defined()) fail("register_parameter", "parameter '{}' is undefined", name);
  parameters_.emplace_back(std::move(name), tensor);
}

void Module::register_module(std::string name, Module& child) {
  for (HookPoint* point : child.hook_points()) point->name_ = name + "." + point->name_;
  children_.emplace_back(std::move(name), &child);
}

void Module::register_hook(std::string name, HookPoint& point) {
  point.name_ = std::move(name);
  hooks_.emplace_back(&point, children_.size());
}

void Module::collect_hooks(std::vector<HookPoint*>& out) const {
  auto own = hooks_.begin();
  for (std::size_t i = 0; i <= children_.size(); ++i) {
    for (; own != hooks_.end() && own->second == i; ++own) out.push_back(own->first);
    if (i < children_.size()) children_[i].second->collect_hooks(out);
  }
}

std::vector<HookPoint*> Module::hook_points() const {
  std::vector<HookPoint*> out;
  collect_hooks(out);
  return out;
}

std::vector<std::string> Module::hook_names() const {
  std::vector<std::string> names;
  for (const HookPoint* point : hook_points()) names.push_back(point->name());
  return names;
}

void Module::add_hook(const std::vector<HookPoint*>& points, const std::string& name, ForwardHook hook) const {
  for (HookPoint* point : points)
    if (point->name() == name) return point->add(std::move(hook));
  fail(type_name(), "no hook point '{}'; this model has {}", name, fmt::join(hook_names(), ", "));
}

void Module::add_hook(const std::string& name, ForwardHook hook) { add_hook(hook_points(), name, std::move(hook)); }

void Module::reset_hooks() {
  for (HookPoint* point : hook_points()) point->clear();
}

Module::Restore::Restore(const std::vector<HookPoint*>& points) {
  for (HookPoint* point : points) sizes.emplace_back(point, point->size());
}

Module::Restore::~Restore() {
  for (const auto& [point, n] : sizes) point->truncate(n);
}

NamedHooks Module::caching_hooks(Activations& cache, const HookFilter& filter) const {
  const std::vector<std::string> names = hook_names();
  filter.check(names, type_name());
  NamedHooks hooks;
  for (const std::string& name : names)
    if (filter.keeps(name))
      hooks.emplace_back(name, [&cache](const Tensor& value, const std::string& point) {
        cache.activations.emplace_back(point, value.detach());
        return value;
      });
  return hooks;
}

void Module::collect(const std::string& prefix, StateDict& out) const {
  for (const auto& entry : parameters_) {
    const Tensor& t = entry.second;
    const bool seen = std::any_of(out.begin(), out.end(), [&](const auto& p) { return p.second.is_same(t); });
    if (!seen) out.emplace_back(prefix + entry.first, t);
  }
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

StateDict Module::named_parameters() const {
  StateDict out;
  collect("", out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

StateDict Module::state_dict() const { return named_parameters(); }

void Module::load_state_dict(const StateDict& state) {
  StateDict own = state_dict();
  std::map<std::string, Tensor> given(state.begin(), state.end());
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& [name, t] : own) {
    const auto it = given.find(name);
    if (it == given.end())
      missing.push_back(name);
    else if (!it->second.defined() || it->second.shape() != t.shape())
      mismatched.push_back(fmt::format("{} (given {}, expected {})", name,
                                       it->second.defined() ? to_string(it->second.shape()) : "undefined",
                                       to_string(t.shape())));
  }
  for (const auto& entry : state) {
    const std::string& name = entry.first;
    if (std::none_of(own.begin(), own.end(), [&](const auto& p) { return p.first == name; })) unexpected.push_back(name);
  }
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
    std::vector<std::string> parts;
    if (!missing.empty()) parts.push_back(fmt::format("missing {}", fmt::join(missing, ", ")));
    if (!unexpected.empty()) parts.push_back(fmt::format("unexpected {}", fmt::join(unexpected, ", ")));
    if (!mismatched.empty()) parts.push_back(fmt::format("mis-shaped {}", fmt::join(mismatched, ", ")));
    fail("load_state_dict", "{}", fmt::join(parts, "; "));
  }
  for (auto& [name, t] : own) t.copy_(given.at(name));
}

void Module::train(bool mode) {
  training_ = mode;
  for (auto& [name, child] : children_) child->train(mode);
}

void Module::zero_grad() {
  for (Tensor& t : parameters()) t.zero_grad();
}

void Module::to(DType dtype) {
  for (Tensor& t : parameters())
    if (t.dtype() != dtype) t.set_data(t.detach().to(dtype));
}

}  // namespace qkv::nn
