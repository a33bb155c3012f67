#include "tests/helpers.hpp"

#include "qkv/nn/layers.hpp"

using namespace qkv;
using namespace qkv::nn;
using namespace qkv::test;
using Catch::Matchers::Contains;

TEST_CASE("Linear follows PyTorch: weight (out, in), y = x Wᵀ + b") {
  Linear m(2, 3, true, DType::float64);
  CHECK(m.weight.shape() == Shape{3, 2});
  CHECK(m.bias.shape() == Shape{3});
  m.weight.copy_(f64({{1, 0}, {1, 1}, {0, 2}}));
  m.bias.copy_(f64({10, 20, 30}));
  check_close(m(f64({{1, 2}})), {{11, 23, 34}});
  CHECK_FALSE(Linear(2, 3, false).bias.defined());
}

TEST_CASE("Linear initialises weight and bias from U(-1/sqrt(in), 1/sqrt(in))") {
  Generator gen(4);
  Linear m(64, 256, true, DType::float64, gen);
  const double bound = 1.0 / 8;
  double lo = 1, hi = -1, sum_sq = 0;
  for (double v : m.weight.value<double>()) lo = std::min(lo, v), hi = std::max(hi, v), sum_sq += v * v;
  CHECK(lo >= -bound);
  CHECK(hi <= bound);
  CHECK(lo < -0.99 * bound);
  CHECK(hi > 0.99 * bound);
  // The variance of U(-a, a) is a²/3.
  CHECK(sum_sq / double(m.weight.numel()) == Approx(bound * bound / 3).epsilon(0.03));
  for (double v : m.bias.value<double>()) CHECK(std::abs(v) <= bound);
}

TEST_CASE("Embedding looks rows up, and LayerNorm starts as the identity affine map") {
  Embedding e(5, 2, DType::float64);
  e.weight.copy_(f64({{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}}));
  check_close(e(IndexArray{4, 0}), {{8, 9}, {0, 1}});
  LayerNorm ln(4, 1e-5, true, DType::float64);
  check_close(ln.weight, {1, 1, 1, 1});
  check_close(ln.bias, {0, 0, 0, 0});
  const double r = 1 / std::sqrt(1.25 + 1e-5);
  check_close(ln(f64({1, 2, 3, 4})), {-1.5 * r, -0.5 * r, 0.5 * r, 1.5 * r});
  CHECK(LayerNorm(4, 1e-5, false).parameters().empty());
}

TEST_CASE("sinusoidal positions are sin and cos of t / 10000^(2i/D)") {
  SinusoidalPositionalEncoding pe(4, 4);
  const Array<double> p = pe.table(DType::float64).value<double>();
  check_close(Array<double>(xt::view(p, 0)), {0, 1, 0, 1});
  check_close(Array<double>(xt::view(p, 2)), {std::sin(2.0), std::cos(2.0), std::sin(0.02), std::cos(0.02)});
  // forward adds rows offset … offset + T − 1.
  check_close(pe(zeros({1, 2, 4}, DType::float64), 1), {{{std::sin(1.0), std::cos(1.0), std::sin(0.01), std::cos(0.01)},
                                                         {std::sin(2.0), std::cos(2.0), std::sin(0.02), std::cos(0.02)}}});
  CHECK(pe.parameters().empty());
}

TEST_CASE("learned positions add table rows and refuse positions past max_len") {
  LearnedPositionalEncoding pe(3, 2, DType::float64);
  pe.weight.copy_(f64({{1, 2}, {3, 4}, {5, 6}}));
  check_close(pe(ones({2, 2}, DType::float64), 1), {{4, 5}, {6, 7}});
  CHECK(invalid_argument_message([&] { pe(zeros({3, 2}, DType::float64), 1); }) ==
        "LearnedPositionalEncoding: positions 1 to 4 are beyond max_len 3");
  CHECK_THAT(invalid_argument_message([&] { pe(zeros({3, 5}, DType::float64)); }), Contains("must be (..., T, 2)"));
}
