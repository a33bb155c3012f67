#pragma once
// gradcheck: compares the tape's gradients with central differences, in float64.
//
//   auto r = gradcheck([](const std::vector<Tensor>& in) { return tanh(in[0]); }, {x});
//   REQUIRE(r.passed);   // else r.failure names the input, the index, and both values
//
// The output's gradient is checked along one random direction u (seeded): the analytic
// u·∂f/∂x_i comes from backward(u), the numeric one from (u·f(x+εe_i) − u·f(x−εe_i)) / 2ε.
// An element passes when |analytic − numeric| ≤ atol + rtol·|numeric|.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "qkv/core/tensor.hpp"

namespace qkv {

struct GradcheckOptions {
  double eps = 1e-6;   // the finite-difference step
  double atol = 1e-6;  // per-op tolerances: raise them for ops with large curvature
  double rtol = 1e-5;
  std::uint64_t seed = 0;  // of the random output direction
};

struct GradcheckResult {
  bool passed = true;
  double max_abs_error = 0;  // max |analytic − numeric|
  double max_rel_error = 0;  // max |analytic − numeric| / max(|numeric|, atol)
  std::size_t checked = 0;   // elements compared
  std::string failure;       // the worst failing element, named; empty when passed
};

using GradcheckFunction = std::function<Tensor(const std::vector<Tensor>&)>;

// Checks the gradient of f with respect to every input that requires grad. Inputs must be
// float64 leaves. Their .grad is cleared before and after.
GradcheckResult gradcheck(const GradcheckFunction& f, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& options = {});

}  // namespace qkv
