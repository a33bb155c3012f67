// Vectorised float32 row loops; see core/detail/kernels.hpp. Written as plain loops that GCC and
// Clang vectorise for each target of target_clones. This file is compiled with -ffp-contract=off:
// no multiply-add is fused, so every version computes the same bits.
#include "core/detail/kernels.hpp"

#include <bit>
#include <cstdint>
#include <limits>

#define QKV_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

namespace qkv::detail {

namespace {

constexpr std::size_t lanes = 16;

// e^x as Cephes' expf computes it: x = n·ln 2 + r with |r| ≤ ln 2 / 2, e^r by a degree-7
// polynomial, then 2^n put into the exponent bits. Relative error below 2 ulp over [−87.3, 88];
// below that the result is 0, above it e^88.
inline float exp_approx(float x) {
  constexpr float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
  constexpr float round_magic = 12582912.0f;  // 1.5·2^23: adding and subtracting it rounds to an integer
  const bool underflow = x < -87.33654f;
  x = x > 88.0f ? 88.0f : x;
  x = underflow ? 0.0f : x;
  const float n = (x * log2e + round_magic) - round_magic;
  const float r = (x - n * ln2_hi) - n * ln2_lo;
  const float z = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * z + r + 1.0f;
  const float scale = std::bit_cast<float>(std::int32_t((std::int32_t(n) + 127) << 23));
  return underflow ? 0.0f : p * scale;
}

}  // namespace

QKV_CLONES float exp_shifted_sum(float* x, std::size_t n, float shift) {
  for (std::size_t j = 0; j < n; ++j) x[j] = exp_approx(x[j] - shift);
  float acc[lanes] = {};
  std::size_t j = 0;
  for (; j + lanes <= n; j += lanes)
    for (std::size_t k = 0; k < lanes; ++k) acc[k] += x[j + k];
  for (std::size_t k = 0; j < n; ++j, ++k) acc[k] += x[j];
  float total = 0;
  for (std::size_t k = 0; k < lanes; ++k) total += acc[k];
  return total;
}

QKV_CLONES float max_of(const float* x, std::size_t n) {
  float acc[lanes];
  for (std::size_t k = 0; k < lanes; ++k) acc[k] = -std::numeric_limits<float>::infinity();
  std::size_t j = 0;
  for (; j + lanes <= n; j += lanes)
    for (std::size_t k = 0; k < lanes; ++k) acc[k] = acc[k] > x[j + k] ? acc[k] : x[j + k];
  for (std::size_t k = 0; j < n; ++j, ++k) acc[k] = acc[k] > x[j] ? acc[k] : x[j];
  float m = acc[0];
  for (std::size_t k = 1; k < lanes; ++k) m = m > acc[k] ? m : acc[k];
  return m;
}

QKV_CLONES void scale_by(float* x, std::size_t n, float factor) {
  for (std::size_t j = 0; j < n; ++j) x[j] *= factor;
}

QKV_CLONES void softmax_backward_row(const float* p, float* d, std::size_t n) {
  float acc[lanes] = {};
  std::size_t j = 0;
  for (; j + lanes <= n; j += lanes)
    for (std::size_t k = 0; k < lanes; ++k) acc[k] += p[j + k] * d[j + k];
  for (std::size_t k = 0; j < n; ++j, ++k) acc[k] += p[j] * d[j];
  float c = 0;
  for (std::size_t k = 0; k < lanes; ++k) c += acc[k];
  for (j = 0; j < n; ++j) d[j] = p[j] * (d[j] - c);
}

float vector_exp(float x) { return exp_approx(x); }

}  // namespace qkv::detail
