#pragma once
// Matrix products and the thread pool, for core's op .cpp files.
#include <algorithm>
#include <cstddef>
#include <functional>

namespace qkv::detail {

// Row-major C (M×N) = alpha · op(A) (M×K) · op(B) (K×N) + beta · C, with leading dimensions, so
// that a head's slice of a packed (T, H·d) array is a matrix in place. op transposes when asked.
// Large products are split into row blocks across the pool's threads.
void gemm(bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, float alpha, const float* A,
          std::size_t lda, const float* B, std::size_t ldb, float beta, float* C, std::size_t ldc);
void gemm(bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, double alpha, const double* A,
          std::size_t lda, const double* B, std::size_t ldb, double beta, double* C, std::size_t ldc);

// One small product shape, run many times (per head in attention, per block of a small layer):
// row-major C (M×N) = op(A) (M×K) · B (K×N), plus C when `accumulate`, op(A) = Aᵀ when trans_a.
// It runs a kernel libxsmm generated for this CPU and these sizes when it could make one, and
// gemm (on the calling thread) otherwise. A call from several threads at once is safe.
template <class T>
class SmallGemm {
 public:
  SmallGemm(bool trans_a, std::size_t M, std::size_t N, std::size_t K, std::size_t lda, std::size_t ldb,
            std::size_t ldc, bool accumulate);
  void operator()(const T* A, const T* B, T* C) const;
  bool generated() const { return kernel_ != nullptr; }

 private:
  bool trans_a_, accumulate_;
  std::size_t M_, N_, K_, lda_, ldb_, ldc_;
  void (*kernel_)() = nullptr;  // libxsmm's function, type-erased to keep its header out of here
};

extern template class SmallGemm<float>;
extern template class SmallGemm<double>;

// dst (cols × rows, contiguous) = srcᵀ, for src rows × cols with rows of ld elements. Large ones
// go through libxsmm's generated transposes.
template <class T>
void transpose(const T* src, std::size_t rows, std::size_t cols, std::size_t ld, T* dst);

// Runs task(i) for i in [0, n) on the pool (the calling thread takes part) and returns when all
// are done; the first exception a task throws is rethrown here. Inside a task, a nested
// parallel_for runs serially on that thread.
void parallel_for(std::size_t n, const std::function<void(std::size_t)>& task);
// Whether the calling thread is running a task of parallel_for's (nested work then runs serially).
bool in_parallel_task();

// Runs f(lo, hi) for the consecutive ranges of at most `block` items that tile [0, n), across the
// pool: rows of a loss, slabs of a layer's rows, runs of attention heads. One range runs at once,
// on the calling thread.
template <class F>
void parallel_ranges(std::size_t n, std::size_t block, F&& f) {
  if (n == 0) return;
  block = std::max<std::size_t>(block, 1);
  if (n <= block) return f(std::size_t(0), n);
  parallel_for((n + block - 1) / block, [&](std::size_t i) { f(i * block, std::min(n, (i + 1) * block)); });
}

// Elements per task when a large elementwise pass (an activation, a bias added to every row, an
// embedding's rows) is split across the pool: below two of these it runs on the calling thread.
constexpr std::size_t parallel_grain = std::size_t(1) << 15;

// f(lo, hi) over runs of the rows of a rows × cols pass, about parallel_grain elements a run.
template <class F>
void parallel_rows(std::size_t rows, std::size_t cols, F&& f) {
  parallel_ranges(rows, std::max<std::size_t>(1, parallel_grain / std::max<std::size_t>(cols, 1)), f);
}

// The width of the runs of columns a rows × cols pass that must keep each column's order (a sum
// down the rows) splits into, one run a thread in multiples of 16 columns: cols itself (no split)
// on one thread, inside a task, or for a pass under two grains or of fewer than 32 columns.
std::size_t column_run(std::size_t rows, std::size_t cols);

}  // namespace qkv::detail
