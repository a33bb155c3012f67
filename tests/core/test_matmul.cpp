#include "tests/helpers.hpp"

#include "qkv/core/random.hpp"
#include "qkv/core/runtime.hpp"

using namespace qkv;
using namespace qkv::test;
using Catch::Matchers::Contains;

namespace {
// The textbook triple loop, as an independent reference for 2-D products.
Array<double> reference_matmul(const Array<double>& a, const Array<double>& b) {
  Array<double> c = xt::zeros<double>(Shape{a.shape()[0], b.shape()[1]});
  for (std::size_t i = 0; i < a.shape()[0]; ++i)
    for (std::size_t j = 0; j < b.shape()[1]; ++j)
      for (std::size_t k = 0; k < a.shape()[1]; ++k) c(i, j) += a(i, k) * b(k, j);
  return c;
}
}  // namespace

TEST_CASE("matmul of 2-D matrices against hand-computed values") {
  check_close(matmul(f64({{1, 2, 3}, {4, 5, 6}}), f64({{7, 8}, {9, 10}, {11, 12}})), {{58, 64}, {139, 154}});
  check_close(matmul(f32({{1, 2}, {3, 4}}), f32({{1, 0}, {0, 1}})), {{1, 2}, {3, 4}}, 0);
}

TEST_CASE("matmul with 1-D operands drops the vector's dimension") {
  check_close(matmul(f64({1, 2}), f64({{1, 2, 3}, {4, 5, 6}})), {9, 12, 15});
  check_close(matmul(f64({{1, 2}, {3, 4}}), f64({1, 1})), {3, 7});
  check_close(matmul(f64({1, 2}), f64({3, 4})), Array<double>(11.0));
}

TEST_CASE("batched matmul broadcasts batch dimensions") {
  Generator gen(3);
  const Tensor a = randn({2, 1, 3, 4}, DType::float64, gen);  // batch (2,1)
  const Tensor b = randn({3, 4, 5}, DType::float64, gen);     // batch (3)
  const Tensor y = matmul(a, b);
  REQUIRE(y.shape() == Shape{2, 3, 3, 5});
  const auto& av = a.value<double>();
  const auto& bv = b.value<double>();
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t j = 0; j < 3; ++j) {
      INFO("batch " << i << "," << j);
      const Array<double> ai = xt::view(av, i, 0), bj = xt::view(bv, j);
      check_close(Array<double>(xt::view(y.value<double>(), i, j)), reference_matmul(ai, bj));
    }
}

TEST_CASE("matmul gradients: dA = dY Bᵀ and dB = Aᵀ dY, summed over broadcast batches") {
  Tensor a = f64({{1, 2}, {3, 4}}, true);
  Tensor b = f64({{5, 6}, {7, 8}}, true);
  sum(matmul(a, b)).backward();
  check_close(a.grad(), {{11, 15}, {11, 15}});  // row sums of B
  check_close(b.grad(), {{4, 4}, {6, 6}});      // column sums of A
  // The same (2,2) weight used by a batch of 3: its gradient is the sum over the batch.
  Tensor w = f64({{1, 0}, {0, 1}}, true);
  Tensor x = f64({{{1, 2}}, {{3, 4}}, {{5, 6}}});  // (3,1,2)
  sum(matmul(x, w)).backward();
  check_close(w.grad(), {{9, 9}, {12, 12}});
}

TEST_CASE("matmul errors name the shapes at fault") {
  CHECK(invalid_argument_message([] { matmul(f64({{1, 2, 3}, {4, 5, 6}}), zeros({4, 5}, DType::float64)); }) ==
        "matmul: (2,3) @ (4,5): inner dimensions 3 and 4 differ");
  CHECK_THAT(invalid_argument_message([] { matmul(zeros({2, 3, 4}, DType::float64), zeros({3, 4, 5}, DType::float64)); }),
             Contains("batch dimensions (2) and (3) cannot broadcast"));
  CHECK_THAT(invalid_argument_message([] { matmul(scalar(1, DType::float64), f64({1})); }),
             Contains("at least one dimension"));
}

TEST_CASE("linear computes x Wᵀ + b with the weight as (out, in)") {
  const Tensor x = f64({{1, 2}, {3, 4}});     // (2, in=2)
  const Tensor w = f64({{1, 0}, {1, 1}, {0, 2}});  // (out=3, in=2)
  check_close(linear(x, w, f64({10, 20, 30})), {{11, 23, 34}, {13, 27, 38}});
  check_close(linear(reshape(x, {1, 2, 2}), w, Tensor()), {{{1, 3, 4}, {3, 7, 8}}});
}

TEST_CASE("linear's gradients: dx = dy W, dW = dyᵀ x, db = Σ dy") {
  Tensor x = f64({{1, 2}, {3, 4}}, true);
  Tensor w = f64({{1, 0}, {1, 1}, {0, 2}}, true);
  Tensor b = f64({0, 0, 0}, true);
  sum(linear(x, w, b) * f64({1, 2, 3})).backward();
  check_close(x.grad(), {{3, 8}, {3, 8}});            // (1,2,3) W
  check_close(w.grad(), {{4, 6}, {8, 12}, {12, 18}});  // (1,2,3)ᵀ (Σ rows of x)
  check_close(b.grad(), {2, 4, 6});
}

TEST_CASE("linear on many rows (blocks, slabs and a short last block) against loops, on 1 and 2 threads") {
  // 1100 rows: five slabs of 256 rows, the last of 76 (a block of 64 and one of 12); float64 and float32.
  Generator gen(11);
  const std::size_t N = 1100, in = 5, out = 7;
  const Tensor x64 = randn({N, in}, DType::float64, gen), w64 = randn({out, in}, DType::float64, gen),
               b64 = randn({out}, DType::float64, gen), g64 = randn({N, out}, DType::float64, gen);
  const Array<double> X = x64.value<double>(), W = w64.value<double>(), G = g64.value<double>();
  Array<double> y = reference_matmul(X, xt::transpose(W));
  for (std::size_t i = 0; i < N; ++i)
    for (std::size_t o = 0; o < out; ++o) y(i, o) += b64.value<double>()(o);
  const Array<double> dx = reference_matmul(G, W), dw = reference_matmul(xt::transpose(G), X);
  Array<double> db = xt::zeros<double>(Shape{out});
  for (std::size_t i = 0; i < N; ++i)
    for (std::size_t o = 0; o < out; ++o) db(o) += G(i, o);
  for (DType dtype : {DType::float64, DType::float32})
    for (std::size_t threads : {1, 2}) {
      INFO(dtype_name(dtype) << ", " << threads << " threads");
      set_num_threads(threads);
      const double tol = dtype == DType::float64 ? 1e-12 : 2e-5;
      const Tensor x = x64.to(dtype).detach().requires_grad_(), w = w64.to(dtype).detach().requires_grad_(),
                   b = b64.to(dtype).detach().requires_grad_();
      const Tensor out_y = linear(x, w, b);
      out_y.backward(g64.to(dtype));
      check_close(out_y, y, tol);
      check_close(x.grad(), dx, tol);
      check_close(w.grad(), dw, tol * 10);
      check_close(b.grad(), db, tol * 10);
    }
  set_num_threads(1);
}

TEST_CASE("linear errors name the shapes") {
  CHECK(invalid_argument_message([] { linear(zeros({2, 3}, DType::float64), zeros({4, 2}, DType::float64), Tensor()); }) ==
        "linear: input (2,3) does not end in the weight's in-features 2 (weight (4,2))");
  CHECK_THAT(invalid_argument_message([] {
    linear(zeros({2, 3}, DType::float64), zeros({4, 3}, DType::float64), zeros({3}, DType::float64));
  }), Contains("bias has shape (3) but the weight (4,3) needs (4)"));
}
