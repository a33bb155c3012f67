// Vectorised loops, float32 and, where both dtypes use them, float64; see core/detail/kernels.hpp.
// Written with GCC's vector extensions (which Clang shares), compiled once for each target of
// target_clones. This file is compiled with -ffp-contract=off: no multiply-add is fused, so every
// version computes the same bits.
#include "qkv/core/detail/kernels.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "qkv/core/detail/blas.hpp"
#include "qkv/core/detail/target_clones.hpp"

// Helpers are compiled into each clone, for its instruction set, only when inlined.
#define QKV_INLINE [[gnu::always_inline]] inline
#define QKV_INLINE_LAMBDA __attribute__((always_inline))

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

// --- Sums. Every sum here, of float32 and float64 alike, adds its terms in one cascade, as
// PyTorch's and numpy's reductions do: runs of 16 terms, each run over four accumulators that take
// every fourth term, then the runs' sums pairwise. A term meets at most 6 + log2(n / 16) additions
// rather than up to n, so the error of a sum grows with log n: 10^6 float32 numbers of mean 0.5
// (tests/core/test_float32_accuracy.cpp) are off by 3.4e-6 relative one at a time, by 2e-8 in the
// cascade (PyTorch's own cascade: 4e-8).

constexpr std::size_t cascade_run = 16;

// Terms [0, n) in runs of Partials::run: partials.set(slot, j0, j1) puts the sum of terms [j0, j1)
// in a slot, and partials.merge(a, b) adds slot b (later terms) into slot a. The runs combine as the
// digits of a binary counter: after the 2^k-th run, two sums of 2^(k−1) runs each become one. The
// sum of everything ends in slot 0 (0 when n = 0).
template <class Partials>
QKV_INLINE void cascade(std::size_t n, Partials& p) {
  std::size_t depth = 0;
  for (std::size_t j0 = 0, runs = 1; j0 < n; j0 += Partials::run, ++runs) {
    p.set(depth++, j0, std::min(n, j0 + Partials::run));
    for (std::size_t r = runs; r % 2 == 0; r /= 2, --depth) p.merge(depth - 2, depth - 1);
  }
  if (depth == 0) p.set(0, 0, 0);
  for (; depth > 1; --depth) p.merge(depth - 2, depth - 1);
}

// The cascade's partial sums as values of V (a float, a double, or a vector of 16 floats summed
// lane by lane), from term(j, v), which sets v to term j; terms are asked for in order, so a term
// may also store what it computed.
template <class V, class Term>
struct Partials {
  static constexpr std::size_t run = cascade_run;
  explicit Partials(Term& term) : term(term) {}  // the slots left unset: each is set before it is read
  Term& term;
  V slot[64];  // depth ≤ log2(n / run) + 1
  QKV_INLINE void set(std::size_t s, std::size_t j0, std::size_t j1) {
    V a[4] = {}, t = {};  // indexed by constants only, so that they stay in registers
    std::size_t j = j0;
    for (; j + 4 <= j1; j += 4)
      for (std::size_t k = 0; k < 4; ++k) {
        term(j + k, t);
        a[k] += t;
      }
    for (std::size_t k = 0; k < 3; ++k)
      if (j + k < j1) {
        term(j + k, t);
        a[k] += t;
      }
    slot[s] = (a[0] + a[1]) + (a[2] + a[3]);
  }
  QKV_INLINE void merge(std::size_t a, std::size_t b) { slot[a] += slot[b]; }
};

// Σ_j term(j) for j < n, in the cascade.
template <class V, class Term>
QKV_INLINE void cascade_sum(std::size_t n, Term&& term, V& total) {
  Partials<V, std::remove_reference_t<Term>> p(term);
  cascade(n, p);
  total = p.slot[0];
}

// Contiguous numbers as vectors of 64 bytes: 16 floats or 8 doubles.
template <class T>
struct Wide;
template <>
struct Wide<float> {
  using type = Floats;
};
template <>
struct Wide<double> {
  using type = double __attribute__((vector_size(64)));
};

// Σ a_j, or Σ a_j b_j when b is not null, over j < n: the cascade down the whole vectors of
// consecutive entries, their lanes added pairwise, then the fewer than `width` entries left over
// (a short row is only those: a loss over a few classes, a head's width).
template <class T>
QKV_INLINE T sum_contiguous(const T* a, const T* b, std::size_t n) {
  using V = typename Wide<T>::type;
  constexpr std::size_t width = sizeof(V) / sizeof(T);
  const std::size_t whole = n / width;
  T total = 0;
  if (whole > 0) {
    V sum;
    cascade_sum(whole, [&](std::size_t j, V& v) QKV_INLINE_LAMBDA {
      std::memcpy(&v, a + j * width, sizeof v);
      if (!b) return;
      V w;
      std::memcpy(&w, b + j * width, sizeof w);
      v *= w;
    }, sum);
    T lanes_left[width];
    std::memcpy(lanes_left, &sum, sizeof sum);
    for (std::size_t half = width / 2; half > 0; half /= 2)
      for (std::size_t i = 0; i < half; ++i) lanes_left[i] += lanes_left[i + half];
    total = lanes_left[0];
  }
  T rest[4] = {};
  for (std::size_t j = whole * width, k = 0; j < n; ++j, k = (k + 1) % 4) rest[k] += b ? a[j] * b[j] : a[j];
  return total + ((rest[0] + rest[1]) + (rest[2] + rest[3]));
}

// The cascade's partial sums as whole rows of g (rows × cols, rows ld apart), for its column
// sums: g is read in order, and the loops along a row vectorise.
template <class T>
struct RowPartials {
  static constexpr std::size_t run = cascade_run;
  const T* g;
  std::size_t cols, ld;
  T* slots;  // depth rows of cols
  QKV_INLINE void set(std::size_t s, std::size_t j0, std::size_t j1) {
    T* to = slots + s * cols;
    std::fill(to, to + cols, T(0));
    for (std::size_t j = j0; j < j1; ++j)
      for (std::size_t c = 0; c < cols; ++c) to[c] += g[j * ld + c];
  }
  QKV_INLINE void merge(std::size_t a, std::size_t b) {
    T *to = slots + a * cols, *from = slots + b * cols;
    for (std::size_t c = 0; c < cols; ++c) to[c] += from[c];
  }
};

// sums[c] += Σ_i g[i, c] over g rows × cols, rows ld apart: the cascade down the rows. A column
// gets the same bits whichever other columns are summed with it.
template <class T>
QKV_INLINE void column_sums(const T* g, std::size_t rows, std::size_t cols, std::size_t ld, T* sums) {
  if (ld == 1) {  // one column, contiguous
    sums[0] += sum_contiguous<T>(g, nullptr, rows);
    return;
  }
  const std::size_t depth = std::bit_width(rows / RowPartials<T>::run) + 1;
  // The partial sums on the stack when they are few (a bias's gradient): no allocation per call.
  constexpr std::size_t on_stack = 4096 / sizeof(T);
  T stack[on_stack];
  std::vector<T> heap(depth * cols > on_stack ? depth * cols : 0);
  RowPartials<T> p{g, cols, ld, heap.empty() ? stack : heap.data()};
  cascade(rows, p);
  for (std::size_t c = 0; c < cols; ++c) sums[c] += p.slots[c];
}

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

// --- Softmax over the columns of a block: one body for float32 and float64. A block's 16 columns
// are one vector of T, with integers of T's width for its masks; e^x is exp_approx for float32 and
// std::exp lane by lane for float64 (whose gradient checks need its correct rounding).
template <class T>
struct Lanes;
template <>
struct Lanes<float> {
  using V = Floats;
  using Int = std::int32_t;
  using Mask = Ints;
};
template <>
struct Lanes<double> {
  using V = double __attribute__((vector_size(8 * lanes)));
  using Int = std::int64_t;
  using Mask = std::int64_t __attribute__((vector_size(8 * lanes)));
};
template <class T>
using Vec = typename Lanes<T>::V;

QKV_INLINE void load(Vec<double>& v, const double* p) { std::memcpy(&v, p, sizeof v); }
QKV_INLINE void store(double* p, const Vec<double>& v) { std::memcpy(p, &v, sizeof v); }

QKV_INLINE void exp_lanes(Floats& x) { exp_approx(x); }
QKV_INLINE void exp_lanes(Vec<double>& x) {
  for (std::size_t c = 0; c < lanes; ++c) x[c] = std::exp(x[c]);
}

// The limits of a block's columns as T's masks compare them: row j is visible in the lanes where
// Mask{} + Int(j) < n.
template <class T>
QKV_INLINE void load_limits(typename Lanes<T>::Mask& n, const std::int32_t* limits) {
  Ints n32;
  std::memcpy(&n32, limits, sizeof n32);
  n = __builtin_convertvector(n32, typename Lanes<T>::Mask);
}

// A column's limit within [0, rows].
QKV_INLINE std::size_t rows_within(std::size_t rows, std::int32_t limit) {
  return std::min<std::size_t>(rows, std::size_t(std::max(0, limit)));
}

// Rows [0, used) hold every entry a block's columns may see: the largest limit, at most rows.
QKV_INLINE std::size_t used_rows(std::size_t rows, const std::int32_t* limits) {
  return rows_within(rows, *std::max_element(limits, limits + lanes));
}

// The first two passes of a block's softmax over rows [0, used): visible entries scaled and the
// rest −inf, raising m to their maximum; then each entry e^(x − shift) (shift_of(m)). shift and
// each column's sum, total, come back.
template <class T>
QKV_INLINE void exponentials(T* s, std::size_t ld, std::size_t used, const std::int32_t* limits, T scale, Vec<T>& m,
                             Vec<T>& shift, Vec<T>& total) {
  using Mask = typename Lanes<T>::Mask;
  using Int = typename Lanes<T>::Int;
  const Vec<T> minus_inf = Vec<T>{} - std::numeric_limits<T>::infinity();
  Mask n;
  load_limits<T>(n, limits);
  Vec<T> v;
  for (std::size_t j = 0; j < used; ++j) {
    load(v, s + j * ld);
    v = Mask{} + Int(j) < n ? v * scale : minus_inf;
    store(s + j * ld, v);
    m = m > v ? m : v;
  }
  shift = m;
  to_softmax_shift(shift);
  cascade_sum(used, [&](std::size_t j, Vec<T>& e) QKV_INLINE_LAMBDA {
    load(e, s + j * ld);
    e -= shift;
    exp_lanes(e);
    store(s + j * ld, e);
  }, total);
}

template <class T>
QKV_INLINE void softmax_columns_of(T* s, std::size_t ld, std::size_t rows, const std::int32_t* limits, T scale) {
  const Vec<T> zero = {};
  const std::size_t used = used_rows(rows, limits);
  Vec<T> m = zero - std::numeric_limits<T>::infinity(), shift, total, v;
  exponentials(s, ld, used, limits, scale, m, shift, total);
  const Vec<T> inv = total > zero ? T(1) / total : zero;
  for (std::size_t j = 0; j < used; ++j) {
    load(v, s + j * ld);
    store(s + j * ld, v * inv);
  }
  for (std::size_t j = used; j < rows; ++j) store(s + j * ld, zero);
}

template <class T>
QKV_INLINE void softmax_backward_columns_of(const T* p, T* d, std::size_t ld, std::size_t rows,
                                            const std::int32_t* limits, T scale, const T* dots) {
  using Mask = typename Lanes<T>::Mask;
  using Int = typename Lanes<T>::Int;
  const Vec<T> zero = {};
  Mask n;
  load_limits<T>(n, limits);
  const std::size_t used = used_rows(rows, limits);
  Vec<T> c, pj, dj;
  if (dots)
    load(c, dots);
  else
    cascade_sum(used, [&](std::size_t j, Vec<T>& pd) QKV_INLINE_LAMBDA {
      load(pj, p + j * ld);
      load(dj, d + j * ld);
      pd = Mask{} + Int(j) < n ? pj * dj : zero;  // past a column's limit, d may hold anything
    }, c);
  for (std::size_t j = 0; j < used; ++j) {
    load(pj, p + j * ld);
    load(dj, d + j * ld);
    const Vec<T> g = (pj * (dj - c)) * scale;
    store(d + j * ld, Mask{} + Int(j) < n ? g : zero);
  }
  for (std::size_t j = used; j < rows; ++j) store(d + j * ld, zero);
}

template <class T>
QKV_INLINE void online_softmax_columns_of(T* s, std::size_t ld, std::size_t rows, const std::int32_t* limits, T scale,
                                          T* max, T* total, T* rescale) {
  const std::size_t used = used_rows(rows, limits);
  Vec<T> m_old, m, shift, sum, l;
  load(m_old, max);
  m = m_old;
  exponentials(s, ld, used, limits, scale, m, shift, sum);
  for (std::size_t j = used; j < rows; ++j) store(s + j * ld, Vec<T>{});
  Vec<T> r = m_old - shift;  // −inf before anything was seen: e^−inf = 0
  exp_lanes(r);
  load(l, total);
  store(rescale, r);
  store(total, l * r + sum);
  store(max, m);
}

template <class T>
QKV_INLINE void softmax_again_columns_of(T* s, std::size_t ld, std::size_t rows, const std::int32_t* limits, T scale,
                                         const T* shift, const T* inverse) {
  using Mask = typename Lanes<T>::Mask;
  using Int = typename Lanes<T>::Int;
  const Vec<T> zero = {}, minus_inf = zero - std::numeric_limits<T>::infinity();
  Mask n;
  load_limits<T>(n, limits);
  const std::size_t used = used_rows(rows, limits);
  Vec<T> m, inv, v;
  load(m, shift);
  load(inv, inverse);
  for (std::size_t j = 0; j < used; ++j) {
    load(v, s + j * ld);
    v = Mask{} + Int(j) < n ? v * scale - m : minus_inf;
    exp_lanes(v);
    store(s + j * ld, v * inv);
  }
  for (std::size_t j = used; j < rows; ++j) store(s + j * ld, zero);
}

}  // namespace

QKV_CLONES void softmax_columns(float* s, std::size_t ld, std::size_t rows, const std::int32_t* limits, float scale) {
  softmax_columns_of(s, ld, rows, limits, scale);
}
QKV_CLONES void softmax_columns(double* s, std::size_t ld, std::size_t rows, const std::int32_t* limits, double scale) {
  softmax_columns_of(s, ld, rows, limits, scale);
}

QKV_CLONES void softmax_backward_columns(const float* p, float* d, std::size_t ld, std::size_t rows,
                                         const std::int32_t* limits, float scale, const float* dots) {
  softmax_backward_columns_of(p, d, ld, rows, limits, scale, dots);
}
QKV_CLONES void softmax_backward_columns(const double* p, double* d, std::size_t ld, std::size_t rows,
                                         const std::int32_t* limits, double scale, const double* dots) {
  softmax_backward_columns_of(p, d, ld, rows, limits, scale, dots);
}

QKV_CLONES void online_softmax_columns(float* s, std::size_t ld, std::size_t rows, const std::int32_t* limits,
                                       float scale, float* max, float* total, float* rescale) {
  online_softmax_columns_of(s, ld, rows, limits, scale, max, total, rescale);
}
QKV_CLONES void online_softmax_columns(double* s, std::size_t ld, std::size_t rows, const std::int32_t* limits,
                                       double scale, double* max, double* total, double* rescale) {
  online_softmax_columns_of(s, ld, rows, limits, scale, max, total, rescale);
}

QKV_CLONES void softmax_again_columns(float* s, std::size_t ld, std::size_t rows, const std::int32_t* limits,
                                      float scale, const float* shift, const float* inverse) {
  softmax_again_columns_of(s, ld, rows, limits, scale, shift, inverse);
}
QKV_CLONES void softmax_again_columns(double* s, std::size_t ld, std::size_t rows, const std::int32_t* limits,
                                      double scale, const double* shift, const double* inverse) {
  softmax_again_columns_of(s, ld, rows, limits, scale, shift, inverse);
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
QKV_INLINE void add_block_loop(const T* __restrict part, std::size_t rows, std::size_t cols, T* __restrict out,
                               std::size_t ld, const T* rescale) {
  for (std::size_t i = 0; i < rows; ++i) {
    T* o = out + i * ld;
    const T* a = part + i * cols;
    if (rescale) {
      const T r = rescale[i];
      for (std::size_t c = 0; c < cols; ++c) o[c] = o[c] * r + a[c];
    } else {
      for (std::size_t c = 0; c < cols; ++c) o[c] += a[c];
    }
  }
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

namespace {

QKV_CLONES void add_rows_serial(const float* x, std::size_t rows, std::size_t cols, const float* b, float* y) {
  add_rows_loop(x, rows, cols, b, y);
}
QKV_CLONES void add_rows_serial(const double* x, std::size_t rows, std::size_t cols, const double* b, double* y) {
  add_rows_loop(x, rows, cols, b, y);
}

QKV_CLONES void column_sums_serial(const float* g, std::size_t rows, std::size_t cols, std::size_t ld, float* sums) {
  column_sums(g, rows, cols, ld, sums);
}
QKV_CLONES void column_sums_serial(const double* g, std::size_t rows, std::size_t cols, std::size_t ld,
                                   double* sums) {
  column_sums(g, rows, cols, ld, sums);
}

// Large arrays are split across the pool: add_rows by rows, add_column_sums by runs of 16 columns.
// Each element is computed as in one pass, so the bits do not depend on the number of threads.
template <class T>
void add_rows_split(const T* x, std::size_t rows, std::size_t cols, const T* b, T* y) {
  parallel_rows(rows, cols, [&](std::size_t lo, std::size_t hi) {
    add_rows_serial(x + lo * cols, hi - lo, cols, b, y + lo * cols);
  });
}

template <class T>
void column_sums_split(const T* g, std::size_t rows, std::size_t cols, T* sums) {
  parallel_ranges(cols, column_run(rows, cols), [&](std::size_t lo, std::size_t hi) {
    column_sums_serial(g + lo, rows, hi - lo, cols, sums + lo);
  });
}

template <class T>
QKV_INLINE void relu_loop(const T* __restrict x, std::size_t n, T* __restrict y) {
  for (std::size_t i = 0; i < n; ++i) y[i] = x[i] < T(0) ? T(0) : x[i];
}
template <class T>
QKV_INLINE void relu_backward_loop(const T* __restrict y, const T* __restrict g, std::size_t n, T* __restrict dx) {
  for (std::size_t i = 0; i < n; ++i) dx[i] = y[i] > T(0) ? g[i] : T(0);
}
QKV_CLONES void relu_serial(const float* x, std::size_t n, float* y) { relu_loop(x, n, y); }
QKV_CLONES void relu_serial(const double* x, std::size_t n, double* y) { relu_loop(x, n, y); }
QKV_CLONES void relu_backward_serial(const float* y, const float* g, std::size_t n, float* dx) {
  relu_backward_loop(y, g, n, dx);
}
QKV_CLONES void relu_backward_serial(const double* y, const double* g, std::size_t n, double* dx) {
  relu_backward_loop(y, g, n, dx);
}

template <class T>
void relu_split(const T* x, std::size_t n, T* y) {
  parallel_ranges(n, parallel_grain, [&](std::size_t lo, std::size_t hi) { relu_serial(x + lo, hi - lo, y + lo); });
}
template <class T>
void relu_backward_split(const T* y, const T* g, std::size_t n, T* dx) {
  parallel_ranges(n, parallel_grain, [&](std::size_t lo, std::size_t hi) {
    relu_backward_serial(y + lo, g + lo, hi - lo, dx + lo);
  });
}

}  // namespace

void relu(const float* x, std::size_t n, float* y) { relu_split(x, n, y); }
void relu(const double* x, std::size_t n, double* y) { relu_split(x, n, y); }
void relu_backward(const float* y, const float* g, std::size_t n, float* dx) { relu_backward_split(y, g, n, dx); }
void relu_backward(const double* y, const double* g, std::size_t n, double* dx) { relu_backward_split(y, g, n, dx); }

void add_rows(const float* x, std::size_t rows, std::size_t cols, const float* b, float* y) {
  add_rows_split(x, rows, cols, b, y);
}
void add_rows(const double* x, std::size_t rows, std::size_t cols, const double* b, double* y) {
  add_rows_split(x, rows, cols, b, y);
}

QKV_CLONES void add_block(const float* part, std::size_t rows, std::size_t cols, float* out, std::size_t ld,
                          const float* rescale) {
  add_block_loop(part, rows, cols, out, ld, rescale);
}
QKV_CLONES void add_block(const double* part, std::size_t rows, std::size_t cols, double* out, std::size_t ld,
                          const double* rescale) {
  add_block_loop(part, rows, cols, out, ld, rescale);
}

void add_column_sums(const float* g, std::size_t rows, std::size_t cols, float* sums) {
  column_sums_split(g, rows, cols, sums);
}
void add_column_sums(const double* g, std::size_t rows, std::size_t cols, double* sums) {
  column_sums_split(g, rows, cols, sums);
}

QKV_CLONES float sum_of(const float* x, std::size_t n) { return sum_contiguous<float>(x, nullptr, n); }
QKV_CLONES double sum_of(const double* x, std::size_t n) { return sum_contiguous<double>(x, nullptr, n); }
QKV_CLONES float dot(const float* a, const float* b, std::size_t n) { return sum_contiguous(a, b, n); }
QKV_CLONES double dot(const double* a, const double* b, std::size_t n) { return sum_contiguous(a, b, n); }

namespace {

// Layer norm row by row, each row's sums as sum_of and dot compute them.
template <class T>
QKV_INLINE void layer_norm_loop(const T* x, std::size_t N, std::size_t D, const T* w, const T* b, T eps, T* y, T* mean,
                                T* rstd) {
  for (std::size_t i = 0; i < N; ++i) {
    const T* row = x + i * D;
    T* out = y + i * D;  // x − mean first, for the variance
    const T m = sum_contiguous<T>(row, nullptr, D) / T(D);
    for (std::size_t d = 0; d < D; ++d) out[d] = row[d] - m;
    mean[i] = m;
    rstd[i] = T(1) / std::sqrt(sum_contiguous<T>(out, out, D) / T(D) + eps);
    for (std::size_t d = 0; d < D; ++d) out[d] = out[d] * rstd[i] * (w ? w[d] : T(1)) + (b ? b[d] : T(0));
  }
}

template <class T>
QKV_INLINE void layer_norm_backward_loop(const T* x, const T* g, std::size_t N, std::size_t D, const T* w, const T* mean,
                                         const T* rstd, T* dx, T* g_xhat) {
  std::vector<T> xhat(D), ghat(D);
  for (std::size_t i = 0; i < N; ++i) {
    for (std::size_t d = 0; d < D; ++d) {
      xhat[d] = (x[i * D + d] - mean[i]) * rstd[i];
      ghat[d] = g[i * D + d] * (w ? w[d] : T(1));
      if (g_xhat) g_xhat[i * D + d] = g[i * D + d] * xhat[d];
    }
    const T mean_g = sum_contiguous<T>(ghat.data(), nullptr, D) / T(D);
    const T mean_gx = sum_contiguous<T>(ghat.data(), xhat.data(), D) / T(D);
    for (std::size_t d = 0; d < D; ++d) dx[i * D + d] = rstd[i] * (ghat[d] - mean_g - xhat[d] * mean_gx);
  }
}

}  // namespace

QKV_CLONES void layer_norm_rows(const float* x, std::size_t N, std::size_t D, const float* w, const float* b, float eps,
                                float* y, float* mean, float* rstd) {
  layer_norm_loop(x, N, D, w, b, eps, y, mean, rstd);
}
QKV_CLONES void layer_norm_rows(const double* x, std::size_t N, std::size_t D, const double* w, const double* b,
                                double eps, double* y, double* mean, double* rstd) {
  layer_norm_loop(x, N, D, w, b, eps, y, mean, rstd);
}
QKV_CLONES void layer_norm_backward_rows(const float* x, const float* g, std::size_t N, std::size_t D, const float* w,
                                         const float* mean, const float* rstd, float* dx, float* g_xhat) {
  layer_norm_backward_loop(x, g, N, D, w, mean, rstd, dx, g_xhat);
}
QKV_CLONES void layer_norm_backward_rows(const double* x, const double* g, std::size_t N, std::size_t D, const double* w,
                                         const double* mean, const double* rstd, double* dx, double* g_xhat) {
  layer_norm_backward_loop(x, g, N, D, w, mean, rstd, dx, g_xhat);
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

namespace {

template <class T>
QKV_INLINE void softmax_row_of(T* s, std::size_t n, std::size_t limit, T scale) {
  const std::size_t used = std::min(n, limit);
  T m = -std::numeric_limits<T>::infinity();
  for (std::size_t j = 0; j < used; ++j) m = std::max(m, s[j] *= scale);
  T shift = m;  // as softmax_columns: nothing visible, or only −inf, gives all zeros
  to_softmax_shift(shift);
  for (std::size_t j = 0; j < used; ++j) s[j] -= shift;
  exp_in_place(s, used);
  const T total = sum_contiguous<T>(s, nullptr, used);
  const T inv = total > 0 ? T(1) / total : T(0);
  for (std::size_t k = 0; k < used; ++k) s[k] *= inv;
  std::fill(s + used, s + n, T(0));
}

}  // namespace

QKV_CLONES void softmax_row(float* s, std::size_t n, std::size_t limit, float scale) { softmax_row_of(s, n, limit, scale); }
QKV_CLONES void softmax_row(double* s, std::size_t n, std::size_t limit, double scale) {
  softmax_row_of(s, n, limit, scale);
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
