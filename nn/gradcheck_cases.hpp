#pragma once
// The catalogue of gradient checks that `qkv gradcheck` prints and the tests run: one or more
// configurations per op, each a named float64 gradcheck with its own tolerances.
#include <functional>
#include <string>
#include <vector>

#include "qkv/core/gradcheck.hpp"

namespace qkv::nn {

struct GradcheckCase {
  std::string op;    // the op under test, as core/ops.hpp names it
  std::string name;  // op and configuration, e.g. "add (2,3,4)+(4)"
  std::function<GradcheckResult()> run;
};

const std::vector<GradcheckCase>& gradcheck_cases();

}  // namespace qkv::nn
