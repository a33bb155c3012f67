// Vectorised float32 row loops; see core/detail/kernels.hpp. Written with GCC's vector extensions
// (which Clang shares), compiled once for each target of target_clones. This file is compiled with -ffp-contract=off:
// no multiply-add is fused, so every version computes the same bits.
#include "core/detail/kernels.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#define QKV_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
// Helpers are compiled into each clone, for its instruction set, only when inlined.
#define QKV_INLINE [[gnu::always_inline]] inline

namespace qkv::detail {

namespace {

// 16 floats (or ints) as one value: GCC lowers each operation to one AVX-512 instruction, two AVX2
// ones or four SSE ones, with IEEE results lane by lane in every case.
constexpr std::size_t lanes = row_lanes;
using Floats = float __attribute__((vector_size(4 * lanes)));
using Ints = std::int32_t __attribute__((vector_size(4 * lanes)));

QKV_INLINE Floats load(const float* p) {
  Floats v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
QKV_INLINE void store(float* p, Floats v) { std::memcpy(p, &v, sizeof v); }
QKV_INLINE Floats splat(float x) { return Floats{} + x; }
QKV_INLINE Floats select(Ints mask, Floats a, Floats b) { return mask ? a : b; }
QKV_INLINE Floats max(Floats a, Floats b) { return select(a > b, a, b); }

// Lanes [0, n − first) of the chunk that starts at element `first`.
QKV_INLINE Ints visible(std::size_t first, std::size_t n) {
  const Ints lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return lane < Ints{} + std::int32_t(std::min<std::size_t>(n - std::min(first, n), lanes));
}

// Sum and maximum over the lanes, pairwise (lane k with k + 8, then k + 4, ...): a fixed order.
QKV_INLINE Floats fold(Floats v, const Ints& half) { return __builtin_shuffle(v, half); }
constexpr Ints by8 = {8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7};
constexpr Ints by4 = {4, 5, 6, 7, 0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15};
constexpr Ints by2 = {2, 3, 0, 1, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
constexpr Ints by1 = {1, 0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
QKV_INLINE float lane_sum(Floats v) {
  v += fold(v, by8);
  v += fold(v, by4);
  v += fold(v, by2);
  v += fold(v, by1);
  return v[0];
}
QKV_INLINE float lane_max(Floats v) {
  v = max(v, fold(v, by8));
  v = max(v, fold(v, by4));
  v = max(v, fold(v, by2));
  v = max(v, fold(v, by1));
  return v[0];
}

// e^x as Cephes' expf computes it: x = n·ln 2 + r with |r| ≤ ln 2 / 2, e^r by a degree-7
// polynomial, then 2^n put into the exponent bits. Relative error below 2 ulp over [−87.3, 88];
// below that the result is 0, above it e^88.
QKV_INLINE Floats exp_approx(Floats x) {
  constexpr float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
  constexpr float round_magic = 12582912.0f;  // 1.5·2^23: adding and subtracting it rounds to an integer
  const Ints underflow = x < splat(-87.33654f);
  x = select(x > splat(88.0f), splat(88.0f), x);
  x = select(underflow, splat(0.0f), x);
  const Floats n = (x * log2e + round_magic) - round_magic;
  const Floats r = (x - n * ln2_hi) - n * ln2_lo;
  const Floats z = r * r;
  Floats p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * z + r + 1.0f;
  const Floats scale = reinterpret_cast<Floats>((__builtin_convertvector(n, Ints) + 127) << 23);
  return select(underflow, splat(0.0f), p * scale);
}

// The end of the chunks that hold entries [0, n).
QKV_INLINE std::size_t used(std::size_t n) { return (n + lanes - 1) / lanes * lanes; }

}  // namespace

QKV_CLONES void softmax_row(float* x, std::size_t n, std::size_t width, float scale) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::size_t end = used(n);
  Floats m = splat(-inf);
  for (std::size_t j = 0; j < end; j += lanes) {
    const Floats s = select(visible(j, n), load(x + j) * scale, splat(-inf));
    store(x + j, s);
    m = max(m, s);
  }
  const float top = lane_max(m);
  if (top == -inf) {  // nothing visible, or every visible score -inf
    std::fill(x, x + width, 0.0f);
    return;
  }
  Floats total = {};
  for (std::size_t j = 0; j < end; j += lanes) {
    const Floats e = exp_approx(load(x + j) - top);  // exactly 0 for hidden entries (-inf)
    store(x + j, e);
    total += e;
  }
  const float inv = 1.0f / lane_sum(total);
  for (std::size_t j = 0; j < end; j += lanes) store(x + j, load(x + j) * inv);
  std::fill(x + end, x + width, 0.0f);
}

QKV_CLONES void softmax_backward_row(const float* p, float* d, std::size_t n, std::size_t width, float scale) {
  const std::size_t end = used(n);
  Floats acc = {};
  for (std::size_t j = 0; j < end; j += lanes)  // past n, d may hold anything
    acc += select(visible(j, n), load(p + j) * load(d + j), splat(0.0f));
  const float c = lane_sum(acc);
  for (std::size_t j = 0; j < end; j += lanes)
    store(d + j, select(visible(j, n), (load(p + j) * (load(d + j) - c)) * scale, splat(0.0f)));
  std::fill(d + end, d + width, 0.0f);
}

float vector_exp(float x) { return exp_approx(splat(x))[0]; }

}  // namespace qkv::detail
