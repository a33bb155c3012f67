// The thread pool, the choice of OpenBLAS kernels, memory, and gemm.
#include "qkv/core/runtime.hpp"

#include <cblas.h>
#include <libxsmm.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "qkv/core/detail/blas.hpp"
#include "qkv/core/detail/kernels.hpp"

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

thread_local bool in_task = false;

// A hint to the CPU inside a spin loop.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// n − 1 workers plus the caller. Workers spin for a while after a job, since a training step
// issues many small jobs in a row, then sleep. A job is open from when it is posted until the
// caller has run out of tasks to claim; a worker takes part only if it joins while the job is
// open, so the caller never waits for a worker that was slow to wake, only for those still
// running a task.
class Pool {
 public:
  ~Pool() { resize(1); }

  std::size_t size() const { return workers_.size() + 1; }

  void resize(std::size_t n) {
    std::lock_guard serial(run_mutex_);  // not while a job runs
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
      ++generation_;
    }
    wake_.notify_all();
    for (std::thread& w : workers_) w.join();
    workers_.clear();
    stop_ = false;
    // A worker waits for the generation after the one current now: a job posted before the thread
    // first runs is still its to take part in.
    const std::uint64_t now = generation_.load();
    for (std::size_t i = 1; i < n; ++i) workers_.emplace_back([this, now] { work(now); });
  }

  void run(std::size_t n, const std::function<void(std::size_t)>& task) {
    std::lock_guard serial(run_mutex_);  // one job at a time, from any thread
    task_ = &task;
    n_ = n;
    next_.store(0);
    error_ = nullptr;
    {
      std::lock_guard lock(mutex_);
      const std::uint64_t generation = generation_.load() + 1;
      job_.store(generation << 32 | open, std::memory_order_release);
      generation_.store(generation, std::memory_order_release);
    }
    wake_.notify_all();
    drain();
    job_.fetch_and(~open);  // no worker joins from here on
    while ((job_.load(std::memory_order_acquire) & inside) != 0) cpu_relax();
    task_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  // job_: the generation of the current job in the high 32 bits, then the open flag, then the
  // number of workers inside it.
  static constexpr std::uint64_t open = std::uint64_t(1) << 31, inside = open - 1;

  void drain() {
    in_task = true;
    for (std::size_t i; (i = next_.fetch_add(1)) < n_;) {
      try {
        (*task_)(i);
      } catch (...) {
        std::lock_guard lock(error_mutex_);
        if (!error_) error_ = std::current_exception();
        next_.store(n_);
      }
    }
    in_task = false;
  }

  // Joins job `generation` if it is still open.
  bool join(std::uint64_t generation) {
    std::uint64_t j = job_.load(std::memory_order_acquire);
    while ((j >> 32) == (generation & 0xffffffff) && (j & open) != 0)
      if (job_.compare_exchange_weak(j, j + 1, std::memory_order_acq_rel)) return true;
    return false;
  }

  void work(std::uint64_t seen) {
    while (true) {
      // Spin for up to 2 ms for the next job, then sleep until one comes. A training step's serial
      // stretches between jobs (the loss, the optimizer, residual adds) last up to a few tenths of
      // a millisecond; a worker that slept through one joins the next job late, after the
      // wake-up's tens of microseconds. Spinning for 0.2 ms made the tiny benchmark 8% slower.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
      for (unsigned spin = 1; generation_.load(std::memory_order_acquire) == seen; ++spin) {
        cpu_relax();
        if (spin % 64 == 0 && std::chrono::steady_clock::now() > deadline) break;
      }
      if (generation_.load() == seen) {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return generation_.load() != seen; });
      }
      seen = generation_.load();
      if (stop_) return;
      if (!join(seen)) continue;
      drain();
      job_.fetch_sub(1, std::memory_order_release);
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mutex_, run_mutex_, error_mutex_;
  std::condition_variable wake_;
  std::atomic<std::uint64_t> generation_{0}, job_{0};
  std::atomic<bool> stop_{false};
  const std::function<void(std::size_t)>* task_ = nullptr;
  std::size_t n_ = 0;
  std::atomic<std::size_t> next_{0};
  std::exception_ptr error_;
};

Pool& pool() {
  static Pool p;
  return p;
}

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
  const std::size_t threads = in_task ? 1 : get_num_threads();
  constexpr std::size_t min_work = std::size_t(1) << 18, align = 16;
  const std::size_t blocks = std::min(threads, std::max<std::size_t>(1, M * N * K / min_work));
  if (blocks <= 1 || std::max(M, N) < 2 * align) {
    blas(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const bool by_rows = M >= N || M >= blocks * 64;
  const std::size_t extent = by_rows ? M : N;
  const std::size_t step = (extent / blocks + align - 1) / align * align;
  const std::size_t count = (extent + step - 1) / step;
  detail::parallel_for(count, [&](std::size_t i) {
    const std::size_t lo = i * step, len = std::min(step, extent - lo);
    if (by_rows)
      blas(ta, tb, len, N, K, alpha, ta ? A + lo : A + lo * lda, lda, B, ldb, beta, C + lo * ldc, ldc);
    else
      blas(ta, tb, M, len, K, alpha, A, lda, tb ? B + lo * ldb : B + lo, ldb, beta, C + lo, ldc);
  });
}

}  // namespace

void set_num_threads(std::size_t n) {
  if (n == 0) throw std::invalid_argument("set_num_threads: the number of threads must be at least 1, got 0");
  openblas_set_num_threads(1);
  if (pool().size() != n) pool().resize(n);
}

std::size_t get_num_threads() { return pool().size(); }

void reuse_freed_memory() {
  // Blocks up to 32 MiB (glibc's largest threshold) come from the heap, whose top is never trimmed.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, -1);
}

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

void parallel_for(std::size_t n, const std::function<void(std::size_t)>& task) {
  if (n == 0) return;
  if (in_task || n == 1 || pool().size() == 1) {
    for (std::size_t i = 0; i < n; ++i) task(i);
    return;
  }
  pool().run(n, task);
}

}  // namespace detail

}  // namespace qkv
