#pragma once
// Vectorised loops: the softmax (float32; float64 plainly), over blocks of 16 query columns of transposed
// scores Sᵀ (one row per key), where every operation is between whole rows of 16, with no sum or
// maximum across lanes; e^x over an array, for cross-entropy; rows added to rows (a bias, a
// sum); sums; small transposes (float32 and float64). Every sum, the softmax's included, adds in
// a cascade (pairwise over runs of 16 terms, as PyTorch's and numpy's do), so that its rounding
// error grows with the logarithm of the number of terms, not with the number. Each is compiled for AVX-512, AVX2 and the x86-64
// baseline, and the CPU picks one when the program loads (target_clones). No multiply-add is
// fused, so every version computes the same bits.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace qkv::detail {

constexpr std::size_t softmax_lanes = 16;

// A softmax's largest visible value m (a number, or a vector of them lane by lane) made, in place,
// the shift its exponentials are taken against: m, or 0 when it saw nothing visible or only −inf,
// so that they are e^−inf = 0, not NaN. Every softmax of qkv's (the kernels here, softmax,
// log_softmax, attention) follows it. (In place: a vector crosses no call by value.)
template <class V>
[[gnu::always_inline]] inline void to_softmax_shift(V& m) {
  if constexpr (std::is_floating_point_v<V>) {
    m = m == -std::numeric_limits<V>::infinity() ? V(0) : m;
  } else {
    const V zero = {};
    m = m == zero - std::numeric_limits<std::remove_cvref_t<decltype(m[0])>>::infinity() ? zero : m;
  }
}

// The softmax kernel, for attention and the softmax op alike: 16 vectors side by side as the
// columns of a block. Column c of the block (s[j·ld + c] for j < rows) sees its first limits[c]
// entries. Each column becomes the softmax of scale · its visible entries, 0 elsewhere; a column
// with nothing visible, or only scores of −inf, becomes 0. Entries past a column's limit are read
// but never used. One body serves both dtypes, 16 columns as one vector: e^x is vector_exp for
// float32 and std::exp, lane by lane, for float64.
void softmax_columns(float* s, std::size_t ld, std::size_t rows, const std::int32_t* limits, float scale);
void softmax_columns(double* s, std::size_t ld, std::size_t rows, const std::int32_t* limits, double scale);
// One vector of n contiguous entries (a single query's scores, in decoding), of which the first
// `limit` are visible: as a column of softmax_columns, vectorised along the entries, its total
// summed as sum_of sums.
void softmax_row(float* s, std::size_t n, std::size_t limit, float scale);
void softmax_row(double* s, std::size_t n, std::size_t limit, double scale);
// Softmax backward in place of d, for p a block softmax_columns made (same ld and limits):
// d[j, c] = scale · p[j, c] · (d[j, c] − dots[c]) over visible entries, 0 elsewhere, where dots[c]
// is Σ_k p[k, c] d[k, c] over the block when `dots` is null, and given otherwise (a block of a
// longer column, whose sum is known beforehand).
void softmax_backward_columns(const float* p, float* d, std::size_t ld, std::size_t rows, const std::int32_t* limits,
                              float scale, const float* dots = nullptr);
void softmax_backward_columns(const double* p, double* d, std::size_t ld, std::size_t rows,
                              const std::int32_t* limits, double scale, const double* dots = nullptr);
// The online softmax of one block of keys, for attention in tiles (FlashAttention): max[c] and
// total[c] are column c's running maximum of scale · score and its sum of exponentials over the
// blocks before. Visible entries become e^(scale · s − m), m the new running maximum, and the rest
// 0; rescale[c] = e^(m_old − m), what the column's earlier sums are multiplied by (0 when it saw
// nothing before); total[c] = total[c] · rescale[c] + the block's sum; max[c] = m. A column that
// has seen only −inf keeps max −inf and total 0.
void online_softmax_columns(float* s, std::size_t ld, std::size_t rows, const std::int32_t* limits, float scale,
                            float* max, float* total, float* rescale);
void online_softmax_columns(double* s, std::size_t ld, std::size_t rows, const std::int32_t* limits, double scale,
                            double* max, double* total, double* rescale);
// A block's weights again from what the online softmax left of each column: e^(scale · s − shift[c]) ·
// inverse[c] over visible entries, 0 elsewhere, where shift is the column's maximum (0 for a column
// that saw nothing) and inverse 1 / its total (0 for a column that saw nothing).
void softmax_again_columns(float* s, std::size_t ld, std::size_t rows, const std::int32_t* limits, float scale,
                           const float* shift, const float* inverse);
void softmax_again_columns(double* s, std::size_t ld, std::size_t rows, const std::int32_t* limits, double scale,
                           const double* shift, const double* inverse);

// A row added to every row, and its gradient, on rows × cols row-major blocks (a linear layer's
// bias; a sum that broadcasts; with one row, the sum of two arrays): y[i, c] = x[i, c] + b[c]
// for every row i (y may be x), and sums[c] += Σ_i g[i, c] (down the rows in the cascade, g read
// in order).
void add_rows(const float* x, std::size_t rows, std::size_t cols, const float* b, float* y);
void add_rows(const double* x, std::size_t rows, std::size_t cols, const double* b, double* y);
void add_column_sums(const float* g, std::size_t rows, std::size_t cols, float* sums);
void add_column_sums(const double* g, std::size_t rows, std::size_t cols, double* sums);

// y = max(x, 0) (NaN stays NaN), and dx = g where y > 0, 0 elsewhere, over n elements; large
// arrays split across the pool.
void relu(const float* x, std::size_t n, float* y);
void relu(const double* x, std::size_t n, double* y);
void relu_backward(const float* y, const float* g, std::size_t n, float* dx);
void relu_backward(const double* y, const double* g, std::size_t n, double* dx);

// out (rows × cols, rows ld apart) = out · rescale[i] on row i (no rescale when it is null) + part
// (rows × cols, dense, not overlapping out): a block's product added to a sum of them.
void add_block(const float* part, std::size_t rows, std::size_t cols, float* out, std::size_t ld, const float* rescale);
void add_block(const double* part, std::size_t rows, std::size_t cols, double* out, std::size_t ld, const double* rescale);

// Σ_j x[j] and Σ_j a[j] b[j] over j < n, vectorised along the entries.
float sum_of(const float* x, std::size_t n);
double sum_of(const double* x, std::size_t n);
float dot(const float* a, const float* b, std::size_t n);
double dot(const double* a, const double* b, std::size_t n);

// Layer norm of N rows of D: y = (x − mean) · rstd · w + b (w, b: none when null) with rstd =
// 1/√(var + eps), var biased, each row's mean and rstd kept; and its backward: dx of each row and,
// when g_xhat is not null, g ⊙ x̂ (for dw). Each row's sums as sum_of and dot compute them.
void layer_norm_rows(const float* x, std::size_t N, std::size_t D, const float* w, const float* b, float eps, float* y,
                     float* mean, float* rstd);
void layer_norm_rows(const double* x, std::size_t N, std::size_t D, const double* w, const double* b, double eps,
                     double* y, double* mean, double* rstd);
void layer_norm_backward_rows(const float* x, const float* g, std::size_t N, std::size_t D, const float* w,
                              const float* mean, const float* rstd, float* dx, float* g_xhat);
void layer_norm_backward_rows(const double* x, const double* g, std::size_t N, std::size_t D, const double* w,
                              const double* mean, const double* rstd, double* dx, double* g_xhat);

// dst (cols × rows, contiguous) = srcᵀ, for src rows × cols with rows of ld; for small matrices.
void transpose_small(const float* src, std::size_t rows, std::size_t cols, std::size_t ld, float* dst);
void transpose_small(const double* src, std::size_t rows, std::size_t cols, std::size_t ld, double* dst);

// x[j] = e^x[j] for j < n: as softmax_columns computes it in float32, std::exp in float64.
void exp_in_place(float* x, std::size_t n);
void exp_in_place(double* x, std::size_t n);

// e^x as softmax_columns computes it: within 2 ulp over [−87.3, 88], 0 below (−inf included).
float vector_exp(float x);

}  // namespace qkv::detail
