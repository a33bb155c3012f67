#include "tests/helpers.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "qkv/core/detail/blas.hpp"
#include "qkv/core/detail/kernels.hpp"

using namespace qkv;

TEST_CASE("the vectorised exp is within 2 ulp of the correctly rounded e^x, 0 below -87.3") {
  double worst = 0;
  for (double x = -87.3; x <= 88.0; x += 0.0137) {
    const float xf = float(x);
    const double exact = std::exp(double(xf));  // double's exp, far more precise than float
    const double ulp = std::nextafter(float(exact), std::numeric_limits<float>::infinity()) - float(exact);
    worst = std::max(worst, std::abs(double(detail::vector_exp(xf)) - exact) / ulp);
  }
  INFO("worst error " << worst << " ulp");
  CHECK(worst < 2);
  CHECK(detail::vector_exp(-87.4f) == 0);
  CHECK(detail::vector_exp(-std::numeric_limits<float>::infinity()) == 0);
  CHECK(detail::vector_exp(0) == 1);
}

// A block of 16 columns, one per query, in rows of ld = 19 (past the block: must stay untouched),
// with limits from 0 to 33 around the 16 lanes, against double loops.
TEST_CASE("the softmax column kernels against plain loops, with every limit from 0 to 33") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::size_t rows = 40, ld = 19, lanes = detail::softmax_lanes;
  const float scale = 0.7f;
  const std::int32_t limits[16] = {0, 1, 2, 7, 15, 16, 17, 20, 31, 32, 33, 5, 9, 0, 12, 3};
  std::vector<float> x(rows * ld, nan), p(rows * ld, 0.0f), d(rows * ld, nan);  // NaN past a limit must not leak
  for (std::size_t c = 0; c < lanes; ++c) {
    const std::size_t n = std::size_t(limits[c]);
    for (std::size_t j = 0; j < n; ++j) {
      x[j * ld + c] = float(std::sin(1.3 * double(j) + double(c)) * 4);
      p[j * ld + c] = float(j + 1) / float(n * (n + 1) / 2);  // sums to 1
      d[j * ld + c] = float(std::cos(0.7 * double(j) - double(c)));
    }
  }
  std::vector<float> e = x, g = d;
  detail::softmax_columns(e.data(), ld, rows, limits, scale);
  detail::softmax_backward_columns(p.data(), g.data(), ld, rows, limits, scale);
  for (std::size_t c = 0; c < lanes; ++c) {
    const std::size_t n = std::size_t(limits[c]);
    INFO("column " << c << ", limit " << n);
    double max = -INFINITY, total = 0, sum_pd = 0;
    for (std::size_t j = 0; j < n; ++j) max = std::max(max, scale * double(x[j * ld + c]));
    for (std::size_t j = 0; j < n; ++j) total += std::exp(scale * double(x[j * ld + c]) - max);
    for (std::size_t j = 0; j < n; ++j) sum_pd += double(p[j * ld + c]) * d[j * ld + c];
    for (std::size_t j = 0; j < rows; ++j) {
      const double want_e = j < n ? std::exp(scale * double(x[j * ld + c]) - max) / total : 0.0;
      const double want_g = j < n ? scale * p[j * ld + c] * (d[j * ld + c] - sum_pd) : 0.0;
      CHECK(e[j * ld + c] == Approx(want_e).epsilon(1e-6));
      CHECK(g[j * ld + c] == Approx(want_g).margin(1e-6));
    }
  }
  for (std::size_t j = 0; j < rows; ++j)
    for (std::size_t c = lanes; c < ld; ++c) {
      CHECK(std::isnan(e[j * ld + c]));
      CHECK(std::isnan(g[j * ld + c]));
    }
}

TEST_CASE("a softmax column whose visible scores are all -inf is all zero") {
  const float inf = std::numeric_limits<float>::infinity();
  const std::size_t lanes = detail::softmax_lanes;
  std::int32_t limits[16];
  for (auto& l : limits) l = 2;
  std::vector<float> s(3 * lanes, 5.0f);  // row 2 is past every limit
  for (std::size_t c = 0; c < lanes; ++c) s[c] = -inf;
  s[lanes] = -inf;  // column 0: both visible scores -inf
  detail::softmax_columns(s.data(), lanes, 3, limits, 1.0f);
  for (std::size_t j = 0; j < 3; ++j) CHECK(s[j * lanes] == 0.0f);
  for (std::size_t c = 1; c < lanes; ++c) {  // -inf and 5: all weight on row 1
    CHECK(s[c] == 0.0f);
    CHECK(s[lanes + c] == 1.0f);
    CHECK(s[2 * lanes + c] == 0.0f);
  }
}

namespace {

// A column of 40 scores cut into blocks of rows 7, 16 and 17: the online softmax, block by block,
// carries a weighted sum Σ p · x the way attention carries O (rescaled at each block), and must
// end at the softmax of the whole column; the weights computed again from its statistics must be
// the softmax itself, block by block; and the backward with the column's dot given must equal
// the backward over the whole column.
template <class T>
void check_online_softmax() {
  const std::size_t rows = 40, lanes = detail::softmax_lanes, ld = lanes + 3;
  const std::size_t cuts[] = {0, 7, 23, 40};
  const T scale = T(0.8), inf = std::numeric_limits<T>::infinity();
  // Column limits: none, inside each block, at the cuts, all; column 5 sees only −inf scores.
  const std::int32_t limits[16] = {0, 1, 5, 7, 8, 3, 22, 23, 24, 30, 39, 40, 40, 12, 17, 2};
  std::vector<T> x(rows * ld), d(rows * ld);
  for (std::size_t j = 0; j < rows; ++j)
    for (std::size_t c = 0; c < ld; ++c) {
      x[j * ld + c] = c == 5 ? -inf : T(std::sin(0.9 * double(j) + 1.7 * double(c)) * 6);
      d[j * ld + c] = T(std::cos(0.5 * double(j) - double(c)));
    }
  // Each column's visible rows within block b.
  const auto limits_in_block = [&](std::size_t b, std::int32_t* out) {
    for (std::size_t c = 0; c < lanes; ++c)
      out[c] = std::int32_t(std::clamp<std::int64_t>(limits[c] - std::int64_t(cuts[b]), 0, std::int64_t(cuts[b + 1] - cuts[b])));
  };
  T max[16], total[16], rescale[16], carried[16] = {};
  std::fill(max, max + lanes, -inf);
  std::fill(total, total + lanes, T(0));
  std::vector<T> online = x;
  for (std::size_t b = 0; b + 1 < std::size(cuts); ++b) {
    std::int32_t block_limits[16];
    limits_in_block(b, block_limits);
    T* block = online.data() + cuts[b] * ld;
    detail::online_softmax_columns(block, ld, cuts[b + 1] - cuts[b], block_limits, scale, max, total, rescale);
    for (std::size_t c = 0; c < lanes; ++c) {
      carried[c] = b == 0 ? T(0) : carried[c] * rescale[c];
      for (std::size_t j = cuts[b]; j < cuts[b + 1]; ++j) carried[c] += online[j * ld + c] * T(j + 1);
    }
  }
  std::vector<T> whole = x, again = x, dots(lanes);
  detail::softmax_columns(whole.data(), ld, rows, limits, scale);
  T shift[16], inverse[16];
  for (std::size_t c = 0; c < lanes; ++c) {
    shift[c] = max[c] == -inf ? T(0) : max[c];
    inverse[c] = total[c] > 0 ? 1 / total[c] : T(0);
  }
  for (std::size_t b = 0; b + 1 < std::size(cuts); ++b) {
    std::int32_t block_limits[16];
    limits_in_block(b, block_limits);
    detail::softmax_again_columns(again.data() + cuts[b] * ld, ld, cuts[b + 1] - cuts[b], block_limits, scale, shift, inverse);
  }
  const double tol = std::is_same_v<T, float> ? 2e-6 : 1e-14;
  for (std::size_t c = 0; c < lanes; ++c) {
    INFO("column " << c << ", limit " << limits[c]);
    // The reference in double: softmax of scale · x over the visible rows.
    const std::size_t n = std::size_t(limits[c]);
    double m = -INFINITY, sum = 0, mean = 0, dot = 0;
    for (std::size_t j = 0; j < n; ++j) m = std::max(m, double(scale) * double(x[j * ld + c]));
    std::vector<double> p(rows, 0.0);
    if (m > -INFINITY) {
      for (std::size_t j = 0; j < n; ++j) sum += p[j] = std::exp(double(scale) * double(x[j * ld + c]) - m);
      for (std::size_t j = 0; j < n; ++j) p[j] /= sum;
    }
    for (std::size_t j = 0; j < n; ++j) mean += p[j] * double(j + 1);
    for (std::size_t j = 0; j < n; ++j) dot += p[j] * double(d[j * ld + c]);
    dots[c] = T(dot);
    CHECK(double(carried[c] * inverse[c]) == Approx(mean).epsilon(tol).margin(tol));
    CHECK(double(total[c]) == Approx(sum).epsilon(tol));
    if (c == 5 || n == 0) CHECK((max[c] == -inf && total[c] == 0));
    for (std::size_t j = 0; j < rows; ++j) {
      CHECK(double(again[j * ld + c]) == Approx(p[j]).margin(tol));
      CHECK(again[j * ld + c] == Approx(whole[j * ld + c]).margin(tol));
    }
  }
  // Backward: with the dot given, block by block, as over the whole column at once.
  std::vector<T> given = d, computed = d;
  detail::softmax_backward_columns(whole.data(), computed.data(), ld, rows, limits, scale);
  for (std::size_t b = 0; b + 1 < std::size(cuts); ++b) {
    std::int32_t block_limits[16];
    limits_in_block(b, block_limits);
    detail::softmax_backward_columns(whole.data() + cuts[b] * ld, given.data() + cuts[b] * ld, ld, cuts[b + 1] - cuts[b],
                                     block_limits, scale, dots.data());
  }
  for (std::size_t j = 0; j < rows; ++j)
    for (std::size_t c = 0; c < lanes; ++c) CHECK(double(given[j * ld + c]) == Approx(double(computed[j * ld + c])).margin(tol * 10));
}

}  // namespace

TEST_CASE("the online softmax over blocks of rows ends at the whole column's softmax, and its statistics give the weights again, both dtypes") {
  check_online_softmax<float>();
  check_online_softmax<double>();
}

namespace {

// SmallGemm's C (M×N, rows of ldc) against a double-precision loop, for op(A) = A or Aᵀ.
template <class T>
void check_small_gemm(bool trans_a, std::size_t M, std::size_t N, std::size_t K, bool accumulate) {
  const std::size_t lda = (trans_a ? M : K) + 3, ldb = N + 2, ldc = N + 5;  // rows longer than the matrices
  std::vector<T> A((trans_a ? K : M) * lda), B(K * ldb), C(M * ldc);
  for (std::size_t i = 0; i < A.size(); ++i) A[i] = T(std::sin(0.37 * double(i)));
  for (std::size_t i = 0; i < B.size(); ++i) B[i] = T(std::cos(0.23 * double(i)));
  for (std::size_t i = 0; i < C.size(); ++i) C[i] = T(0.5 * std::sin(0.11 * double(i)));
  const std::vector<T> before = C;
  const detail::SmallGemm<T> product(trans_a, M, N, K, lda, ldb, ldc, accumulate);
  if (M * N * K <= 128 * 128 * 128 && __builtin_cpu_supports("avx2")) CHECK(product.generated());
  product(A.data(), B.data(), C.data());
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-13;
  for (std::size_t i = 0; i < M; ++i)
    for (std::size_t j = 0; j < ldc; ++j) {
      if (j >= N) {  // past the matrix: untouched
        CHECK(C[i * ldc + j] == before[i * ldc + j]);
        continue;
      }
      double want = accumulate ? double(before[i * ldc + j]) : 0.0;
      for (std::size_t k = 0; k < K; ++k)
        want += double(trans_a ? A[k * lda + i] : A[i * lda + k]) * double(B[k * ldb + j]);
      CHECK(double(C[i * ldc + j]) == Approx(want).margin(tol * double(K)));
    }
}

}  // namespace

TEST_CASE("SmallGemm against a double loop: op(A) = A and Aᵀ, set and accumulate, both dtypes") {
  for (bool trans_a : {false, true})
    for (bool accumulate : {false, true})
      for (const auto& [M, N, K] : std::vector<std::array<std::size_t, 3>>{{32, 32, 8}, {32, 8, 32}, {7, 5, 3}, {64, 16, 64}}) {
        INFO("trans_a " << trans_a << ", accumulate " << accumulate << ", M N K " << M << " " << N << " " << K);
        check_small_gemm<float>(trans_a, M, N, K, accumulate);
        check_small_gemm<double>(trans_a, M, N, K, accumulate);
      }
}

TEST_CASE("SmallGemm hands products past 128³ multiply-adds to gemm, with the same result") {
  const detail::SmallGemm<float> big(false, 130, 130, 130, 130, 130, 130, false);
  CHECK_FALSE(big.generated());
  check_small_gemm<float>(false, 130, 130, 130, false);
  check_small_gemm<double>(true, 129, 131, 130, true);
}

TEST_CASE("transpose: small (16-row tiles and the rest) and large (libxsmm), rows longer than the matrix, both dtypes") {
  for (const auto& [rows, cols] : std::vector<std::array<std::size_t, 2>>{{5, 3}, {37, 8}, {70, 20}, {128, 32}}) {
    INFO(rows << " × " << cols);
    const std::size_t ld = cols + 7;
    std::vector<float> src(rows * ld), dst(rows * cols, -1.0f);
    std::vector<double> src64(rows * ld), dst64(rows * cols, -1.0);
    for (std::size_t i = 0; i < src.size(); ++i) src64[i] = src[i] = float(i);
    detail::transpose(src.data(), rows, cols, ld, dst.data());
    detail::transpose(src64.data(), rows, cols, ld, dst64.data());
    std::size_t wrong = 0;
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c)
        wrong += dst[c * rows + r] != src[r * ld + c] || dst64[c * rows + r] != src64[r * ld + c];
    CHECK(wrong == 0);
  }
}

TEST_CASE("the row softmax equals a column of the column kernel, zero past its limit, and zero when nothing is visible") {
  const std::size_t n = 37, lanes = detail::softmax_lanes;
  for (std::size_t limit : {0, 1, 15, 16, 17, 33, 37, 50}) {
    INFO("limit " << limit);
    std::vector<float> row(n), block(n * lanes, 0.0f);
    std::vector<double> row64(n);
    for (std::size_t j = 0; j < n; ++j) row64[j] = block[j * lanes] = row[j] = float(std::cos(0.9 * double(j)) * 5);
    std::int32_t limits[16] = {};
    limits[0] = std::int32_t(limit);
    detail::softmax_columns(block.data(), lanes, n, limits, 0.8f);
    detail::softmax_row(row.data(), n, limit, 0.8f);
    detail::softmax_row(row64.data(), n, limit, 0.8);
    double total = 0;
    for (std::size_t j = 0; j < n; ++j) {
      CHECK(row[j] == Approx(block[j * lanes]).margin(1e-7).epsilon(1e-6));  // the total's order differs
      CHECK(row64[j] == Approx(row[j]).margin(1e-7).epsilon(1e-6));
      if (j >= limit) CHECK(row[j] == 0);
      total += row[j];
    }
    CHECK(total == Approx(limit == 0 ? 0.0 : 1.0).margin(1e-6));
  }
  std::vector<float> hidden(5, -std::numeric_limits<float>::infinity());
  detail::softmax_row(hidden.data(), 5, 5, 1.0f);
  for (float p : hidden) CHECK(p == 0);
}

namespace {

// add_block on a 5 × 7 block of rows 9 long, against the sum written out, with and without rescale.
template <class T>
void check_add_block() {
  const std::size_t rows = 5, cols = 7, ld = 9;
  std::vector<T> part(rows * cols), out(rows * ld), rescale(rows);
  for (std::size_t i = 0; i < part.size(); ++i) part[i] = T(0.25) * T(i % 11) - T(1);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = T(0.5) * T(i % 13);
  for (std::size_t r = 0; r < rows; ++r) rescale[r] = T(0.5) + T(r);
  for (const T* scale : {static_cast<const T*>(nullptr), static_cast<const T*>(rescale.data())}) {
    std::vector<T> y = out;
    detail::add_block(part.data(), rows, cols, y.data(), ld, scale);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < ld; ++c) {
        // Quarters and halves times halves: every value is exact in float32.
        const T want = c < cols ? out[r * ld + c] * (scale ? scale[r] : T(1)) + part[r * cols + c] : out[r * ld + c];
        CHECK(y[r * ld + c] == want);
      }
  }
}

}  // namespace

TEST_CASE("add_block adds a dense block into rows of another, rescaled or not, and leaves the rest of each row") {
  check_add_block<float>();
  check_add_block<double>();
}
