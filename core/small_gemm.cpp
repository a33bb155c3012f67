// Small products and transposes through libxsmm's generated kernels.
#include <libxsmm.h>

#include <algorithm>
#include <climits>
#include <type_traits>

#include "qkv/core/detail/blas.hpp"
#include "qkv/core/detail/kernels.hpp"

namespace qkv::detail {

// libxsmm's generated code leaves the upper halves of the vector registers in use, and every SSE
// instruction after it (most of this program, built for baseline x86-64) would then pay for
// merging them: 2-3× slower code everywhere.
inline void clear_upper_registers() {
#if defined(__x86_64__)
  static const bool has_avx = __builtin_cpu_supports("avx");
  if (has_avx) asm volatile("vzeroupper" ::: "memory");
#endif
}

template <class T>
SmallGemm<T>::SmallGemm(bool trans_a, std::size_t M, std::size_t N, std::size_t K, std::size_t lda, std::size_t ldb,
                        std::size_t ldc, bool accumulate)
    : trans_a_(trans_a), accumulate_(accumulate), M_(M), N_(N), K_(K), lda_(lda), ldb_(ldb), ldc_(ldc) {
  // Past about 128³ multiply-adds OpenBLAS's cache blocking wins over a generated kernel.
  constexpr double largest = 128.0 * 128 * 128;
  if (M == 0 || N == 0 || K == 0 || double(M) * double(N) * double(K) > largest) return;
  if (std::max({M, N, K, lda, ldb, ldc}) > std::size_t(INT_MAX)) return;
  // libxsmm is column-major: row-major C = op(A)·B is column-major Cᵀ = Bᵀ·op(A)ᵀ, so its first
  // operand is our B and its second our A, transposed when trans_a.
  const libxsmm_blasint m = libxsmm_blasint(N), n = libxsmm_blasint(M), k = libxsmm_blasint(K);
  const libxsmm_blasint first_ld = libxsmm_blasint(ldb), second_ld = libxsmm_blasint(lda), c_ld = libxsmm_blasint(ldc);
  const int flags = trans_a ? LIBXSMM_GEMM_FLAG_TRANS_B : LIBXSMM_GEMM_FLAG_NONE;
  const T alpha = 1, beta = accumulate ? 1 : 0;
  if constexpr (std::is_same_v<T, float>)
    kernel_ = reinterpret_cast<void (*)()>(
        libxsmm_smmdispatch(m, n, k, &first_ld, &second_ld, &c_ld, &alpha, &beta, &flags, nullptr));
  else
    kernel_ = reinterpret_cast<void (*)()>(
        libxsmm_dmmdispatch(m, n, k, &first_ld, &second_ld, &c_ld, &alpha, &beta, &flags, nullptr));
}

template <class T>
void SmallGemm<T>::operator()(const T* A, const T* B, T* C) const {
  if (kernel_ == nullptr) {
    gemm(trans_a_, false, M_, N_, K_, T(1), A, lda_, B, ldb_, accumulate_ ? T(1) : T(0), C, ldc_);
    return;
  }
  if constexpr (std::is_same_v<T, float>)
    reinterpret_cast<libxsmm_smmfunction>(kernel_)(B, A, C);
  else
    reinterpret_cast<libxsmm_dmmfunction>(kernel_)(B, A, C);
  clear_upper_registers();
}

template class SmallGemm<float>;
template class SmallGemm<double>;

template <class T>
void transpose(const T* src, std::size_t rows, std::size_t cols, std::size_t ld, T* dst) {
  // Below about 1,000 elements a plain loop is faster than libxsmm's call.
  if (rows * cols < 1024 || std::max(rows, ld) > std::size_t(INT_MAX)) {
    transpose_small(src, rows, cols, ld, dst);
    return;
  }
  // Column-major, src is cols × rows with leading dimension ld, and dst rows × cols.
  libxsmm_otrans(dst, src, sizeof(T), libxsmm_blasint(cols), libxsmm_blasint(rows), libxsmm_blasint(ld),
                 libxsmm_blasint(rows));
  clear_upper_registers();
}

template void transpose(const float*, std::size_t, std::size_t, std::size_t, float*);
template void transpose(const double*, std::size_t, std::size_t, std::size_t, double*);

}  // namespace qkv::detail
