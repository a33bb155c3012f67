// Matrix products through OpenBLAS, split across the pool; the choice of OpenBLAS's kernels.
#include "qkv/core/runtime.hpp"

#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "qkv/core/detail/blas.hpp"

// OpenBLAS built with DYNAMIC_ARCH (as Debian's is) picks its kernels when it loads. These two
// functions redo that choice; they are exported, but not declared in cblas.h, and absent from
// other builds, hence weak.
extern "C" {
char* openblas_get_corename(void);
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
}

namespace qkv {

namespace {

void blas(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, float alpha, const float* A, std::size_t lda,
          const float* B, std::size_t ldb, float beta, float* C, std::size_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N), int(K),
              alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}
void blas(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, double alpha, const double* A,
          std::size_t lda, const double* B, std::size_t ldb, double beta, double* C, std::size_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N), int(K),
              alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

// Splits C into blocks of rows (or of columns, when it has few rows) across the pool, when the
// product is large enough to pay for it.
template <class T>
void gemm_blocks(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, T alpha, const T* A, std::size_t lda,
                 const T* B, std::size_t ldb, T beta, T* C, std::size_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum: C = beta · C
    for (std::size_t i = 0; i < M; ++i)
      for (std::size_t j = 0; j < N; ++j) C[i * ldc + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
    return;
  }
  // BLAS wants leading dimensions of at least 1 even for empty operands.
  lda = std::max<std::size_t>(lda, 1);
  ldb = std::max<std::size_t>(ldb, 1);
  ldc = std::max<std::size_t>(ldc, 1);
  const std::size_t threads = detail::in_parallel_task() ? 1 : get_num_threads();
  constexpr std::size_t min_work = std::size_t(1) << 18, align = 16;
  const std::size_t blocks = std::min(threads, std::max<std::size_t>(1, M * N * K / min_work));
  if (blocks <= 1 || std::max(M, N) < 2 * align) {
    blas(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const bool by_rows = M >= N || M >= blocks * 64;
  const std::size_t extent = by_rows ? M : N;
  const std::size_t step = (extent / blocks + align - 1) / align * align;
  detail::parallel_ranges(extent, step, [&](std::size_t lo, std::size_t hi) {
    if (by_rows)
      blas(ta, tb, hi - lo, N, K, alpha, ta ? A + lo : A + lo * lda, lda, B, ldb, beta, C + lo * ldc, ldc);
    else
      blas(ta, tb, M, hi - lo, K, alpha, A, lda, tb ? B + lo * ldb : B + lo, ldb, beta, C + lo, ldc);
  });
}

}  // namespace

std::string blas_kernels() { return openblas_get_corename(); }

// OpenBLAS 0.3.21 (Debian 12) does not know some newer Intel CPUs, Sapphire Rapids among them,
// and falls back to its Prescott (SSE3) kernels, a fifth of the speed that the CPU's AVX-512 gives.
// When that happened and the user did not choose with OPENBLAS_CORETYPE, this chooses the newest
// kernels the CPU runs: SkylakeX (AVX-512) or Haswell (AVX2 and FMA).
std::string use_fastest_blas_kernels() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr || !gotoblas_dynamic_init || !gotoblas_dynamic_quit ||
      blas_kernels() != "Prescott")
    return blas_kernels();
  __builtin_cpu_init();
  const char* kernels = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd"))
    kernels = "SkylakeX";
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    kernels = "Haswell";
  if (kernels == nullptr) return blas_kernels();
  // OpenBLAS reads its choice from the environment only: set it for the reload, then take it back.
  setenv("OPENBLAS_CORETYPE", kernels, 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  unsetenv("OPENBLAS_CORETYPE");
  return blas_kernels();
}

namespace detail {

void gemm(bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, float alpha, const float* A,
          std::size_t lda, const float* B, std::size_t ldb, float beta, float* C, std::size_t ldc) {
  gemm_blocks(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm(bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, double alpha, const double* A,
          std::size_t lda, const double* B, std::size_t ldb, double beta, double* C, std::size_t ldc) {
  gemm_blocks(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace detail

}  // namespace qkv
