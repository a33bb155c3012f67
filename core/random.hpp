#pragma once
// One seeded generator (xoshiro256**) behind every random draw: the same seed gives bit-identical
// results on every platform, since no std:: distribution (whose output the standard leaves to the
// library) is used.
#include <array>
#include <cstdint>

#include "qkv/core/tensor.hpp"

namespace qkv {

class Generator {
 public:
  using State = std::array<std::uint64_t, 4>;

  explicit Generator(std::uint64_t seed = default_seed);
  void manual_seed(std::uint64_t seed);
  State state() const { return state_; }
  void set_state(const State& state);

  std::uint64_t next_u64();
  double uniform();  // in [0, 1), 53 random bits
  double normal();   // standard normal (Box-Muller)

  static constexpr std::uint64_t default_seed = 67280421310721ULL;  // PyTorch's default

 private:
  State state_{};
};

// The generator that ops and factories use unless given another.
Generator& default_generator();
void manual_seed(std::uint64_t seed);

// Random tensors, drawn in row-major order.
Tensor randn(const Shape& shape, DType dtype = DType::float32, Generator& gen = default_generator());
Tensor rand(const Shape& shape, DType dtype = DType::float32, Generator& gen = default_generator());
Tensor uniform(const Shape& shape, double low, double high, DType dtype = DType::float32,
               Generator& gen = default_generator());

}  // namespace qkv
