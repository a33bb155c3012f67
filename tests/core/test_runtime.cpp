#include "tests/helpers.hpp"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <thread>
#include <vector>

#include "qkv/core/detail/blas.hpp"
#include "qkv/core/ops.hpp"
#include "qkv/core/random.hpp"
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

TEST_CASE("relu, a bias over rows, a column sum and embedding split across 2 threads equal loops and 1 thread, bit for bit") {
  // 3,000 × 40 floats, above the size at which these passes split across the pool (2 × 2^15
  // elements); the columns split 32 + 8.
  const std::size_t N = 3000, D = 40, V = 50;
  Generator gen(11);
  Array<float> x = (randn({N, D}, DType::float32, gen)).value<float>();
  x(7, 3) = std::numeric_limits<float>::quiet_NaN();
  x(9, 5) = -0.0f;
  const Array<float> bias = randn({D}, DType::float32, gen).value<float>();
  const Array<float> table = randn({V, D}, DType::float32, gen).value<float>();
  const Array<float> upstream = randn({N, D}, DType::float32, gen).value<float>();
  IndexArray ids = IndexArray::from_shape({N});
  for (std::size_t i = 0; i < N; ++i) ids(i) = std::int64_t((i * 37 + i / 7) % V);

  struct Out {
    Array<float> relu, relu_grad, biased, column_sum, gathered, table_grad;
  };
  const auto run = [&](std::size_t threads) {
    set_num_threads(threads);
    Out o;
    const Tensor input = Tensor(x).requires_grad_();
    const Tensor r = relu(input);
    sum(r * Tensor(upstream)).backward();
    o.relu = r.value<float>();
    o.relu_grad = input.grad().value<float>();
    o.biased = (Tensor(x) + Tensor(bias)).value<float>();
    o.column_sum = sum(Tensor(upstream), {0}).value<float>();
    const Tensor w = Tensor(table).requires_grad_();
    const Tensor e = embedding(w, ids);
    sum(e * Tensor(upstream)).backward();
    o.gathered = e.value<float>();
    o.table_grad = w.grad().value<float>();
    set_num_threads(1);
    return o;
  };
  const Out one = run(1), two = run(2);

  // Against loops: relu keeps NaN (as PyTorch) and passes the gradient only where its output is
  // above 0; sums in float64.
  CHECK(std::isnan(two.relu(7, 3)));
  CHECK(two.relu_grad(7, 3) == 0.0f);
  std::vector<double> columns(D, 0.0), table_grad(V * D, 0.0);
  for (std::size_t i = 0; i < N; ++i)
    for (std::size_t d = 0; d < D; ++d) {
      const float v = x(i, d);
      if (!(i == 7 && d == 3)) {
        REQUIRE(two.relu(i, d) == (v > 0 ? v : 0.0f));
        REQUIRE(two.relu_grad(i, d) == (v > 0 ? upstream(i, d) : 0.0f));
      }
      if (!(i == 7 && d == 3)) REQUIRE(two.biased(i, d) == v + bias(d));
      REQUIRE(two.gathered(i, d) == table(std::size_t(ids(i)), d));
      columns[d] += upstream(i, d);
      table_grad[std::size_t(ids(i)) * D + d] += upstream(i, d);
    }
  for (std::size_t d = 0; d < D; ++d) CHECK(two.column_sum(d) == Approx(columns[d]).margin(1e-4));
  for (std::size_t k = 0; k < V * D; ++k) CHECK(two.table_grad.data()[k] == Approx(table_grad[k]).margin(1e-4));

  // The same bits as on one thread, where nothing splits.
  for (auto [a, b] : {std::pair{&one.relu, &two.relu}, {&one.relu_grad, &two.relu_grad}, {&one.biased, &two.biased},
                      {&one.column_sum, &two.column_sum}, {&one.gathered, &two.gathered},
                      {&one.table_grad, &two.table_grad}})
    CHECK(std::memcmp(a->data(), b->data(), a->size() * sizeof(float)) == 0);
}
