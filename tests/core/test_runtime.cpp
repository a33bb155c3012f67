#include "tests/helpers.hpp"

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <thread>
#include <vector>

#include "qkv/core/detail/blas.hpp"
#include "qkv/core/runtime.hpp"

using namespace qkv;

TEST_CASE("parallel_for runs every index of every job exactly once, job after job") {
  for (std::size_t threads : {1, 2, 3}) {
    INFO(threads << " threads");
    set_num_threads(threads);
    CHECK(get_num_threads() == threads);
    // Many short jobs in a row, as a training step makes: a worker that woke late and ran a task
    // of a finished job would count it twice, or count into the next job.
    std::vector<std::vector<std::atomic<int>>> runs(20000);
    for (std::size_t job = 0; job < runs.size(); ++job) {
      runs[job] = std::vector<std::atomic<int>>(1 + job % 9);
      detail::parallel_for(runs[job].size(), [&, job](std::size_t i) { runs[job][i].fetch_add(1); });
    }
    std::size_t wrong = 0;
    for (const auto& job : runs)
      for (const auto& count : job) wrong += count.load() != 1;
    CHECK(wrong == 0);
  }
  set_num_threads(1);
}

TEST_CASE("parallel_for rethrows a task's exception, and the pool works on afterwards") {
  set_num_threads(2);
  std::atomic<int> ran{0};
  CHECK_THROWS_WITH(detail::parallel_for(100,
                                         [&](std::size_t i) {
                                           ran.fetch_add(1);
                                           if (i == 3) throw std::runtime_error("task 3 failed");
                                         }),
                    "task 3 failed");
  CHECK(ran.load() >= 1);
  CHECK(ran.load() <= 100);
  std::atomic<int> after{0};
  detail::parallel_for(50, [&](std::size_t) { after.fetch_add(1); });
  CHECK(after.load() == 50);
  set_num_threads(1);
}

TEST_CASE("a parallel_for inside a task runs on that task's thread, and two callers take turns") {
  set_num_threads(2);
  std::atomic<int> mismatched{0}, total{0};
  detail::parallel_for(8, [&](std::size_t) {
    const auto outer = std::this_thread::get_id();
    detail::parallel_for(4, [&](std::size_t) {
      if (std::this_thread::get_id() != outer) mismatched.fetch_add(1);
      total.fetch_add(1);
    });
  });
  CHECK(mismatched.load() == 0);
  CHECK(total.load() == 32);
  std::atomic<int> sum{0};
  std::thread other([&] {
    for (int j = 0; j < 500; ++j) detail::parallel_for(3, [&](std::size_t) { sum.fetch_add(1); });
  });
  for (int j = 0; j < 500; ++j) detail::parallel_for(3, [&](std::size_t) { sum.fetch_add(1); });
  other.join();
  CHECK(sum.load() == 3000);
  CHECK_THROWS_WITH(set_num_threads(0), Catch::Matchers::Contains("at least 1"));
  set_num_threads(1);
}

TEST_CASE("use_fastest_blas_kernels never leaves OpenBLAS on its SSE3 fallback where the CPU has AVX2 and FMA") {
  // The test binary's main called it, as the programs do; a second call changes nothing.
  const std::string kernels = blas_kernels();
  CHECK(use_fastest_blas_kernels() == kernels);
  __builtin_cpu_init();
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    CHECK(kernels != "Prescott");
}
