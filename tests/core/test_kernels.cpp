#include "tests/helpers.hpp"

#include <array>
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
