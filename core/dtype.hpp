#pragma once
// The runtime element type of a Tensor: float32 for training, float64 for gradient checks.
#include <cstddef>
#include <string_view>

namespace qkv {

enum class DType { float32, float64 };

constexpr std::string_view dtype_name(DType dtype) {
  return dtype == DType::float32 ? "float32" : "float64";
}

constexpr std::size_t dtype_size(DType dtype) { return dtype == DType::float32 ? 4 : 8; }

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::float32; }
template <>
constexpr DType dtype_of<double>() { return DType::float64; }

}  // namespace qkv
