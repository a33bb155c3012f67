#include "qkv/core/random.hpp"

#include <cmath>
#include <numbers>

#include "qkv/core/detail/op.hpp"

namespace qkv {

namespace {

std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

Generator::Generator(std::uint64_t seed) { manual_seed(seed); }

void Generator::manual_seed(std::uint64_t seed) {
  for (auto& s : state_) s = splitmix64(seed);
}

void Generator::set_state(const State& state) {
  if (state == State{}) fail("Generator::set_state", "the all-zero state is not a valid xoshiro256** state");
  state_ = state;
}

std::uint64_t Generator::next_u64() {
  const std::uint64_t result = rotl(state_[1] * 5, 7) * 9;
  const std::uint64_t t = state_[1] << 17;
  state_[2] ^= state_[0];
  state_[3] ^= state_[1];
  state_[1] ^= state_[2];
  state_[0] ^= state_[3];
  state_[2] ^= t;
  state_[3] = rotl(state_[3], 45);
  return result;
}

double Generator::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

double Generator::normal() {
  const double u1 = 1.0 - uniform();  // in (0, 1]: log is finite
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

Generator& default_generator() {
  static Generator gen;
  return gen;
}

void manual_seed(std::uint64_t seed) { default_generator().manual_seed(seed); }

namespace {

template <class T, class Draw>
Tensor drawn(const Shape& shape, Draw draw) {
  Array<T> a = Array<T>::from_shape(shape);
  for (T& v : a) v = static_cast<T>(draw());
  return Tensor(std::move(a));
}

}  // namespace

Tensor randn(const Shape& shape, DType dtype, Generator& gen) {
  return dispatch(dtype, [&](auto t) { return drawn<decltype(t)>(shape, [&] { return gen.normal(); }); });
}

Tensor rand(const Shape& shape, DType dtype, Generator& gen) { return uniform(shape, 0.0, 1.0, dtype, gen); }

Tensor uniform(const Shape& shape, double low, double high, DType dtype, Generator& gen) {
  if (!(low <= high)) fail("uniform", "low {} is above high {}", low, high);
  return dispatch(dtype, [&](auto t) {
    return drawn<decltype(t)>(shape, [&] { return low + (high - low) * gen.uniform(); });
  });
}

}  // namespace qkv
