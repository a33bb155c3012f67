#pragma once
// A tensor's values in float64, as the analyses compute.
#include "qkv/core/tensor.hpp"

namespace qkv::analysis::detail {

inline Array<double> f64(const Tensor& t) { return t.to(DType::float64).value<double>(); }

}  // namespace qkv::analysis::detail
