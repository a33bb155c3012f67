#include "tests/helpers.hpp"

#include <array>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/detail/blas.hpp"
#include "core/detail/kernels.hpp"

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

// Rows of `width` (a multiple of the kernels' 16 lanes) with n visible entries, against double loops.
TEST_CASE("the softmax row kernels against plain loops, on lengths around the 16 lanes") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (std::size_t n : {0, 1, 7, 16, 17, 33}) {
    const std::size_t width = 48;
    const float scale = 0.7f;
    INFO("n = " << n);
    std::vector<float> x(width, nan), p(width, 0.0f), d(width, nan);  // NaN past n must not leak
    for (std::size_t j = 0; j < n; ++j) {
      x[j] = float(std::sin(1.3 * double(j)) * 4);
      p[j] = float(j + 1) / float(n * (n + 1) / 2);  // sums to 1
      d[j] = float(std::cos(0.7 * double(j)));
    }
    double max = -INFINITY, total = 0, c = 0;
    for (std::size_t j = 0; j < n; ++j) max = std::max(max, scale * double(x[j]));
    for (std::size_t j = 0; j < n; ++j) total += std::exp(scale * double(x[j]) - max);
    std::vector<float> e = x;
    detail::softmax_row(e.data(), n, width, scale);
    for (std::size_t j = 0; j < n; ++j) CHECK(e[j] == Approx(std::exp(scale * double(x[j]) - max) / total).epsilon(1e-6));
    for (std::size_t j = n; j < width; ++j) CHECK(e[j] == 0.0f);

    for (std::size_t j = 0; j < n; ++j) c += double(p[j]) * d[j];
    std::vector<float> g = d;
    detail::softmax_backward_row(p.data(), g.data(), n, width, scale);
    for (std::size_t j = 0; j < n; ++j) CHECK(g[j] == Approx(scale * p[j] * (d[j] - c)).margin(1e-6));
    for (std::size_t j = n; j < width; ++j) CHECK(g[j] == 0.0f);
  }
}

TEST_CASE("a softmax row whose visible scores are all -inf is all zero") {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {-inf, -inf, 3.0f};
  x.resize(16, 5.0f);
  detail::softmax_row(x.data(), 2, 16, 1.0f);  // entry 2 on is hidden
  for (float v : x) CHECK(v == 0.0f);
  std::vector<float> y(16, 0.0f);
  y[0] = -inf;
  y[1] = 2.0f;
  detail::softmax_row(y.data(), 2, 16, 1.0f);
  CHECK(y[0] == 0.0f);
  CHECK(y[1] == 1.0f);
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
