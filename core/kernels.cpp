// Vectorised loops, float32 and, where both dtypes use them, float64; see core/detail/kernels.hpp.
// Written with GCC's vector extensions (which Clang shares), compiled once for each target of
// target_clones. This file is compiled with -ffp-contract=off: no multiply-add is fused, so every
// version computes the same bits.
#include "qkv/core/detail/kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "qkv/core/detail/target_clones.hpp"

// Helpers are compiled into each clone, for its instruction set, only when inlined.
#define QKV_INLINE [[gnu::always_inline]] inline

namespace qkv::detail {

namespace {

// 16 floats (or ints) as one value: the compiler lowers each operation to one AVX-512 instruction,
// two AVX2 ones or four SSE ones, with IEEE results lane by lane in every case.
constexpr std::size_t lanes = softmax_lanes;
using Floats = float __attribute__((vector_size(4 * lanes)));
using Ints = std::int32_t __attribute__((vector_size(4 * lanes)));

// Helpers take and give their vectors by reference: a 64-byte vector passed by value crosses the
// call in registers only with AVX-512, and Clang rejects such a call in the other clones even when
// it is inlined.
QKV_INLINE void load(Floats& v, const float* p) { std::memcpy(&v, p, sizeof v); }
QKV_INLINE void store(float* p, const Floats& v) { std::memcpy(p, &v, sizeof v); }

// x = e^x as Cephes' expf computes it: x = n·ln 2 + r with |r| ≤ ln 2 / 2, e^r by a degree-7
// polynomial, then 2^n put into the exponent bits. Relative error below 2 ulp over [−87.3, 88];
// below that the result is 0, above it e^88.
QKV_INLINE void exp_approx(Floats& x) {
  constexpr float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
  constexpr float round_magic = 12582912.0f;  // 1.5·2^23: adding and subtracting it rounds to an integer
  const Floats zero = {};
  const Ints underflow = x < zero - 87.33654f;
  x = x > zero + 88.0f ? zero + 88.0f : x;
  x = underflow ? zero : x;
  const Floats n = (x * log2e + round_magic) - round_magic;
  const Floats r = (x - n * ln2_hi) - n * ln2_lo;
  const Floats z = r * r;
  Floats p = zero + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * z + r + 1.0f;
  const Floats scale = reinterpret_cast<Floats>((__builtin_convertvector(n, Ints) + 127) << 23);
  x = underflow ? zero : p * scale;
}

// A column's limit within [0, rows]: the rows it sees (float64 runs column by column).
QKV_INLINE std::size_t rows_within(std::size_t rows, std::int32_t limit) {
  return std::min<std::size_t>(rows, std::size_t(std::max(0, limit)));
}

// Rows [0, used) hold every entry a block's columns may see: the largest limit, at most rows.
QKV_INLINE std::size_t used_rows(std::size_t rows, const std::int32_t* limits) {
  return rows_within(rows, *std::max_element(limits, limits + lanes));
}

// The first two passes of a block's softmax over rows [0, used): visible entries scaled and the
// rest −inf, raising m to their maximum; then each entry e^(x − shift), where shift is m or, for
// a column with nothing visible or only scores of −inf, 0 (its entries then become e^−inf = 0).
// shift and each column's sum, total, come back.
QKV_INLINE void exponentials(float* s, std::size_t ld, std::size_t used, const std::int32_t* limits, float scale,
                             Floats& m, Floats& shift, Floats& total) {
  const Floats zero = {}, minus_inf = zero - std::numeric_limits<float>::infinity();
  Ints n;
  std::memcpy(&n, limits, sizeof n);
  Floats v;
  for (std::size_t j = 0; j < used; ++j) {
    load(v, s + j * ld);
    v = Ints{} + std::int32_t(j) < n ? v * scale : minus_inf;
    store(s + j * ld, v);
    m = m > v ? m : v;
  }
  shift = m == minus_inf ? zero : m;
  total = zero;
  for (std::size_t j = 0; j < used; ++j) {
    load(v, s + j * ld);
    v -= shift;
    exp_approx(v);
    store(s + j * ld, v);
    total += v;
  }
}

}  // namespace

QKV_CLONES void softmax_columns(float* s, std::size_t ld, std::size_t rows, const std::int32_t* limits, float scale) {
  const Floats zero = {};
  const std::size_t used = used_rows(rows, limits);
  Floats m = zero - std::numeric_limits<float>::infinity(), shift, total, v;
  exponentials(s, ld, used, limits, scale, m, shift, total);
  const Floats inv = total > zero ? 1.0f / total : zero;
  for (std::size_t j = 0; j < used; ++j) {
    load(v, s + j * ld);
    store(s + j * ld, v * inv);
  }
  for (std::size_t j = used; j < rows; ++j) store(s + j * ld, zero);
}

QKV_CLONES void softmax_backward_columns(const float* p, float* d, std::size_t ld, std::size_t rows,
                                         const std::int32_t* limits, float scale, const float* dots) {
  const Floats zero = {};
  Ints n;
  std::memcpy(&n, limits, sizeof n);
  const std::size_t used = used_rows(rows, limits);
  Floats c = zero, pj, dj;
  if (dots)
    load(c, dots);
  else
    for (std::size_t j = 0; j < used; ++j) {  // past a column's limit, d may hold anything
      load(pj, p + j * ld);
      load(dj, d + j * ld);
      c += Ints{} + std::int32_t(j) < n ? pj * dj : zero;
    }
  for (std::size_t j = 0; j < used; ++j) {
    load(pj, p + j * ld);
    load(dj, d + j * ld);
    const Floats g = (pj * (dj - c)) * scale;
    store(d + j * ld, Ints{} + std::int32_t(j) < n ? g : zero);
  }
  for (std::size_t j = used; j < rows; ++j) store(d + j * ld, zero);
}

// float64: the same steps, column by column, with std::exp.
void softmax_columns(double* s, std::size_t ld, std::size_t rows, const std::int32_t* limits, double scale) {
  for (std::size_t c = 0; c < lanes; ++c) {
    const std::size_t n = rows_within(rows, limits[c]);
    double m = -std::numeric_limits<double>::infinity();
    for (std::size_t j = 0; j < n; ++j) {
      s[j * ld + c] *= scale;
      m = std::max(m, s[j * ld + c]);
    }
    const double shift = m == -std::numeric_limits<double>::infinity() ? 0 : m;
    double total = 0;
    for (std::size_t j = 0; j < n; ++j) total += s[j * ld + c] = std::exp(s[j * ld + c] - shift);
    const double inv = total > 0 ? 1 / total : 0;
    for (std::size_t j = 0; j < n; ++j) s[j * ld + c] *= inv;
    for (std::size_t j = n; j < rows; ++j) s[j * ld + c] = 0;
  }
}

void softmax_backward_columns(const double* p, double* d, std::size_t ld, std::size_t rows,
                              const std::int32_t* limits, double scale, const double* dots) {
  for (std::size_t c = 0; c < lanes; ++c) {
    const std::size_t n = rows_within(rows, limits[c]);
    double dot = 0;
    if (dots)
      dot = dots[c];
    else
      for (std::size_t j = 0; j < n; ++j) dot += p[j * ld + c] * d[j * ld + c];
    for (std::size_t j = 0; j < n; ++j) d[j * ld + c] = (p[j * ld + c] * (d[j * ld + c] - dot)) * scale;
    for (std::size_t j = n; j < rows; ++j) d[j * ld + c] = 0;
  }
}

QKV_CLONES void online_softmax_columns(float* s, std::size_t ld, std::size_t rows, const std::int32_t* limits,
                                       float scale, float* max, float* total, float* rescale) {
  const std::size_t used = used_rows(rows, limits);
  Floats m_old, m, shift, sum, l;
  load(m_old, max);
  m = m_old;
  exponentials(s, ld, used, limits, scale, m, shift, sum);
  for (std::size_t j = used; j < rows; ++j) store(s + j * ld, Floats{});
  Floats r = m_old - shift;  // −inf before anything was seen: e^−inf = 0
  exp_approx(r);
  load(l, total);
  store(rescale, r);
  store(total, l * r + sum);
  store(max, m);
}

QKV_CLONES void softmax_again_columns(float* s, std::size_t ld, std::size_t rows, const std::int32_t* limits,
                                      float scale, const float* shift, const float* inverse) {
  const Floats zero = {}, minus_inf = zero - std::numeric_limits<float>::infinity();
  Ints n;
  std::memcpy(&n, limits, sizeof n);
  const std::size_t used = used_rows(rows, limits);
  Floats m, inv, v;
  load(m, shift);
  load(inv, inverse);
  for (std::size_t j = 0; j < used; ++j) {
    load(v, s + j * ld);
    v = Ints{} + std::int32_t(j) < n ? v * scale - m : minus_inf;
    exp_approx(v);
    store(s + j * ld, v * inv);
  }
  for (std::size_t j = used; j < rows; ++j) store(s + j * ld, zero);
}

// float64: the same steps, column by column, with std::exp.
void online_softmax_columns(double* s, std::size_t ld, std::size_t rows, const std::int32_t* limits, double scale,
                            double* max, double* total, double* rescale) {
  const double minus_inf = -std::numeric_limits<double>::infinity();
  for (std::size_t c = 0; c < lanes; ++c) {
    const std::size_t n = rows_within(rows, limits[c]);
    double m = max[c];
    for (std::size_t j = 0; j < n; ++j) m = std::max(m, s[j * ld + c] *= scale);
    const double shift = m == minus_inf ? 0 : m;
    double sum = 0;
    for (std::size_t j = 0; j < n; ++j) sum += s[j * ld + c] = std::exp(s[j * ld + c] - shift);
    for (std::size_t j = n; j < rows; ++j) s[j * ld + c] = 0;
    rescale[c] = std::exp(max[c] - shift);
    total[c] = total[c] * rescale[c] + sum;
    max[c] = m;
  }
}

void softmax_again_columns(double* s, std::size_t ld, std::size_t rows, const std::int32_t* limits, double scale,
                           const double* shift, const double* inverse) {
  for (std::size_t c = 0; c < lanes; ++c) {
    const std::size_t n = rows_within(rows, limits[c]);
    for (std::size_t j = 0; j < n; ++j) s[j * ld + c] = std::exp(s[j * ld + c] * scale - shift[c]) * inverse[c];
    for (std::size_t j = n; j < rows; ++j) s[j * ld + c] = 0;
  }
}

namespace {

// The plain loops below serve float32 and float64 alike; the compiler vectorises each clone.
template <class T>
QKV_INLINE void add_rows_loop(const T* x, std::size_t rows, std::size_t cols, const T* b, T* y) {
  if (x == y) {  // in place: a loop the compiler vectorises without checking x against y
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t c = 0; c < cols; ++c) y[i * cols + c] += b[c];
    return;
  }
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t c = 0; c < cols; ++c) y[i * cols + c] = x[i * cols + c] + b[c];
}

template <class T>
QKV_INLINE void add_column_sums_loop(const T* g, std::size_t rows, std::size_t cols, T* sums) {
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t c = 0; c < cols; ++c) sums[c] += g[i * cols + c];
}

template <class T>
QKV_INLINE void transpose_loop(const T* src, std::size_t rows, std::size_t cols, std::size_t ld, T* dst) {
  std::size_t r0 = 0;
  for (; r0 + lanes <= rows; r0 += lanes)  // 16 rows at a time: each column a gather, then one store
    for (std::size_t c = 0; c < cols; ++c) {
      T column[lanes];
      for (std::size_t k = 0; k < lanes; ++k) column[k] = src[(r0 + k) * ld + c];
      std::copy(column, column + lanes, dst + c * rows + r0);
    }
  for (; r0 < rows; ++r0)
    for (std::size_t c = 0; c < cols; ++c) dst[c * rows + r0] = src[r0 * ld + c];
}

}  // namespace

QKV_CLONES void add_rows(const float* x, std::size_t rows, std::size_t cols, const float* b, float* y) {
  add_rows_loop(x, rows, cols, b, y);
}
QKV_CLONES void add_rows(const double* x, std::size_t rows, std::size_t cols, const double* b, double* y) {
  add_rows_loop(x, rows, cols, b, y);
}

QKV_CLONES void add_column_sums(const float* g, std::size_t rows, std::size_t cols, float* sums) {
  add_column_sums_loop(g, rows, cols, sums);
}
QKV_CLONES void add_column_sums(const double* g, std::size_t rows, std::size_t cols, double* sums) {
  add_column_sums_loop(g, rows, cols, sums);
}

QKV_CLONES void transpose_small(const float* src, std::size_t rows, std::size_t cols, std::size_t ld, float* dst) {
  transpose_loop(src, rows, cols, ld, dst);
}
QKV_CLONES void transpose_small(const double* src, std::size_t rows, std::size_t cols, std::size_t ld, double* dst) {
  transpose_loop(src, rows, cols, ld, dst);
}

QKV_CLONES void exp_in_place(float* x, std::size_t n) {
  Floats v;
  std::size_t j = 0;
  for (; j + lanes <= n; j += lanes) {
    load(v, x + j);
    exp_approx(v);
    store(x + j, v);
  }
  if (j == n) return;
  float tail[lanes] = {};
  std::copy(x + j, x + n, tail);
  load(v, tail);
  exp_approx(v);
  store(tail, v);
  std::copy(tail, tail + (n - j), x + j);
}

QKV_CLONES void softmax_row(float* s, std::size_t n, std::size_t limit, float scale) {
  const std::size_t used = std::min(n, limit);
  float m = -std::numeric_limits<float>::infinity();
  for (std::size_t j = 0; j < used; ++j) m = std::max(m, s[j] *= scale);
  // As softmax_columns: nothing visible, or only −inf, gives all zeros.
  const float shift = m == -std::numeric_limits<float>::infinity() ? 0.0f : m;
  for (std::size_t j = 0; j < used; ++j) s[j] -= shift;
  exp_in_place(s, used);
  // The total in 16 partial sums, added up in a fixed order: the same bits in every clone.
  Floats partial = {}, v;
  std::size_t j = 0;
  for (; j + lanes <= used; j += lanes) {
    load(v, s + j);
    partial += v;
  }
  float total = 0;
  for (std::size_t c = 0; c < lanes; ++c) total += partial[c];
  for (; j < used; ++j) total += s[j];
  const float inv = total > 0 ? 1.0f / total : 0.0f;
  for (std::size_t k = 0; k < used; ++k) s[k] *= inv;
  std::fill(s + used, s + n, 0.0f);
}

void softmax_row(double* s, std::size_t n, std::size_t limit, double scale) {
  const std::size_t used = std::min(n, limit);
  double m = -std::numeric_limits<double>::infinity();
  for (std::size_t j = 0; j < used; ++j) m = std::max(m, s[j] *= scale);
  const double shift = m == -std::numeric_limits<double>::infinity() ? 0 : m;
  double total = 0;
  for (std::size_t j = 0; j < used; ++j) total += s[j] = std::exp(s[j] - shift);
  const double inv = total > 0 ? 1 / total : 0;
  for (std::size_t j = 0; j < used; ++j) s[j] *= inv;
  std::fill(s + used, s + n, 0.0);
}

void exp_in_place(double* x, std::size_t n) {
  for (std::size_t j = 0; j < n; ++j) x[j] = std::exp(x[j]);
}

float vector_exp(float x) {
  float v = x;
  exp_in_place(&v, 1);
  return v;
}

}  // namespace qkv::detail
