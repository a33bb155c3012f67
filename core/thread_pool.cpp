// The thread pool: set_num_threads and parallel_for.
#include "qkv/core/runtime.hpp"

#include <cblas.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "qkv/core/detail/blas.hpp"

namespace qkv {

namespace {

thread_local bool in_task = false;  // on a thread that runs a task of the pool's

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

}  // namespace

void set_num_threads(std::size_t n) {
  if (n == 0) throw std::invalid_argument("set_num_threads: the number of threads must be at least 1, got 0");
  openblas_set_num_threads(1);
  if (pool().size() != n) pool().resize(n);
}

std::size_t get_num_threads() { return pool().size(); }

namespace detail {

void parallel_for(std::size_t n, const std::function<void(std::size_t)>& task) {
  if (n == 0) return;
  if (in_task || n == 1 || pool().size() == 1) {
    for (std::size_t i = 0; i < n; ++i) task(i);
    return;
  }
  pool().run(n, task);
}

bool in_parallel_task() { return in_task; }

std::size_t column_run(std::size_t rows, std::size_t cols) {
  const std::size_t threads = in_task ? 1 : pool().size();
  if (threads == 1 || rows * cols < 2 * parallel_grain || cols < 32) return cols;
  return (cols / threads + 15) / 16 * 16;
}

}  // namespace detail

}  // namespace qkv
