#pragma once
// Lookups in a registry of specs (TaskSpec, ExperimentSpec): each has a `name`.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "qkv/core/shape.hpp"  // fail

namespace qkv::tasks {

template <class Spec>
std::vector<std::string> names_of(const std::vector<Spec>& registry) {
  std::vector<std::string> names;
  for (const Spec& spec : registry) names.push_back(spec.name);
  return names;
}

// Throws std::invalid_argument naming `what` ("task") and listing the known names.
template <class Spec>
const Spec& find_spec(const std::vector<Spec>& registry, const std::string& name, const char* what) {
  for (const Spec& spec : registry)
    if (spec.name == name) return spec;
  fail(what, "unknown {} '{}' (known: {})", what, name, fmt::join(names_of(registry), ", "));
}

}  // namespace qkv::tasks
