#include "tests/helpers.hpp"

#include <xtensor/xrandom.hpp>

using namespace qkv;
using namespace qkv::test;
using Catch::Matchers::Contains;

TEST_CASE("binary ops broadcast as numpy does") {
  const Tensor a = f64(column({1, 2, 3}));  // (3,1)
  const Tensor b = f64({{10, 20}});       // (1,2)
  check_close(a + b, {{11, 21}, {12, 22}, {13, 23}});
  check_close(a - b, {{-9, -19}, {-8, -18}, {-7, -17}});
  check_close(a * b, {{10, 20}, {20, 40}, {30, 60}});
  check_close(a / b, {{0.1, 0.05}, {0.2, 0.1}, {0.3, 0.15}});
  check_close(-a, column({-1, -2, -3}));
  check_close(f64({{{1, 2}, {3, 4}}}) + f64({100, 200}), {{{101, 202}, {103, 204}}});  // (1,2,2)+(2)
  check_close(f64({100, 200}) + f64({{{1, 2}, {3, 4}}}), {{{101, 202}, {103, 204}}});  // (2)+(1,2,2)
  check_close(f32({{1, 2}, {3, 4}}) + f32({{10, 20}, {30, 40}}), {{11, 22}, {33, 44}});
}

TEST_CASE("numbers combine with tensors in the tensor's dtype") {
  const Tensor a = f32({1, 2});
  CHECK((a * 2.0).dtype() == DType::float32);
  check_close(a * 2.0, {2, 4});
  check_close(1.0 - a, {0, -1});
  check_close(a / 4.0, {0.25, 0.5});
  check_close(6.0 / a, {6, 3});
  check_close(a + 0.5, {1.5, 2.5});
}

TEST_CASE("broadcast gradients are summed back to each input's shape") {
  // y = a ⊙ b with a (3,1), b (1,2); with dL/dy = 1: dL/da_i = Σ_j b_j, dL/db_j = Σ_i a_i.
  Tensor a = f64(column({1, 2, 3}), true);
  Tensor b = f64({{10, 20}}, true);
  sum(a * b).backward();
  check_close(a.grad(), column({30, 30, 30}));
  check_close(b.grad(), {{6, 6}});
  // (B,T,D) + (D): the bias gradient sums over B and T.
  Tensor x = f64({{{1, 2}, {3, 4}}, {{5, 6}, {7, 8}}}, true);
  Tensor bias = f64({0.5, -0.5}, true);
  sum((x + bias) * f64({1, 2})).backward();
  check_close(bias.grad(), {4, 8});
  check_close(x.grad(), {{{1, 2}, {1, 2}}, {{1, 2}, {1, 2}}});
}

TEST_CASE("div's gradient: d(a/b)/da = 1/b, d(a/b)/db = -a/b²") {
  Tensor a = f64({3.0}, true), b = f64({2.0}, true);
  sum(a / b).backward();
  check_close(a.grad(), {0.5});
  check_close(b.grad(), {-0.75});
}

TEST_CASE("pointwise functions against hand-computed values") {
  check_close(exp(f64({0, 1})), {1, std::exp(1.0)});
  check_close(log(f64({1, std::exp(2.0)})), {0, 2});
  check_close(sqrt(f64({4, 2.25})), {2, 1.5});
  check_close(pow(f64({2, 3}), 3.0), {8, 27});
  check_close(pow(f64({4}), 0.5), {2});
  check_close(tanh(f64({0, 0.5})), {0, 0.46211715726000974});
  check_close(relu(f64({-1, 0, 2})), {0, 0, 2});
  // x Φ(x): Φ(1) = 0.8413447460685429, Φ(-1) = 0.15865525393145707.
  check_close(gelu(f64({1, -1, 0})), {0.8413447460685429, -0.15865525393145707, 0});
  // 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))) at x = 1.
  check_close(gelu(f64({1}), GeluApproximation::tanh), {0.8411919906082768});
}

TEST_CASE("pointwise gradients against hand-computed values") {
  Tensor x = f64({0.5, 2.0}, true);
  sum(log(x) + sqrt(x) + pow(x, 3.0) + tanh(x)).backward();
  const auto expected = [](double v) { return 1 / v + 0.5 / std::sqrt(v) + 3 * v * v + 1 - std::pow(std::tanh(v), 2); };
  check_close(x.grad(), {expected(0.5), expected(2.0)});
  Tensor r = f64({-1, 0, 2}, true);
  sum(relu(r)).backward();
  check_close(r.grad(), {0, 0, 1});  // 0 at the kink, as PyTorch
  Tensor g = f64({1.0}, true);
  sum(gelu(g)).backward();
  check_close(g.grad(), {0.8413447460685429 + 0.24197072451914337});  // Φ(1) + φ(1)
}

TEST_CASE("float32 computes the same values as float64, to float precision") {
  check_close(gelu(f32({1, -1})), {0.8413447460685429, -0.15865525393145707}, 1e-6);
  check_close(f32({1, 2}) * f32({3, 4}), {3, 8}, 0);
}

TEST_CASE("a shape mismatch in each binary op names the op and both shapes") {
  const Tensor a = f64({{1, 2, 3}, {4, 5, 6}}), b = f64({1, 2});
  for (const auto& [name, op] : std::vector<std::pair<std::string, Tensor (*)(const Tensor&, const Tensor&)>>{
           {"add", add}, {"sub", sub}, {"mul", mul}, {"div", div}}) {
    INFO(name);
    CHECK_THAT(invalid_argument_message([&] { op(a, b); }),
               Contains(name + ": shapes (2,3) and (2) cannot broadcast"));
  }
}

TEST_CASE("broadcasting arithmetic and masked_fill equal xtensor's broadcasting bit for bit") {
  // Each pair: an input of the result's shape and one that broadcasts to it (a row, a column, a
  // single value, a middle axis), either way round, and two that both broadcast.
  const std::vector<std::pair<Shape, Shape>> pairs = {
      {{2, 3, 4}, {4}},       {{2, 3, 4}, {3, 1}},    {{2, 3, 4}, {1}},    {{2, 3, 4}, {}},       {{2, 3, 4}, {2, 1, 4}},
      {{2, 1, 4}, {2, 3, 4}}, {{4}, {2, 3, 4}},       {{3, 1}, {1, 4}},    {{2, 3, 4}, {2, 3, 4}}, {{5, 1, 1}, {5, 2, 3}}};
  Generator gen(11);
  for (const auto& [sa, sb] : pairs) {
    INFO(to_string(sa) << " with " << to_string(sb));
    const Tensor a = randn(sa, DType::float32, gen), b = randn(sb, DType::float32, gen) + 3.0;
    const Array<float>& x = a.value<float>();
    const Array<float>& y = b.value<float>();
    const Array<float> sum_ = x + y, difference = x - y, product = x * y, quotient = x / y;
    CHECK(bool((a + b).value<float>() == sum_));
    CHECK(bool((a - b).value<float>() == difference));
    CHECK(bool((a * b).value<float>() == product));
    CHECK(bool((a / b).value<float>() == quotient));
  }
}

TEST_CASE("masked_fill fills where a mask of any broadcasting shape is true, and passes the gradient elsewhere") {
  // By hand: element (i, j, k) of a (2,3,4) input reads the mask at its last dimensions, 0 where
  // the mask has size 1. (xtensor 0.24's where gets a broadcast mask wrong against an array.)
  Generator gen(13);
  std::size_t filled = 0, elements = 0;
  for (const Shape& sm : std::vector<Shape>{{2, 3, 4}, {3, 4}, {2, 1, 4}, {1, 1, 4}, {3, 1}, {4}, {}}) {
    INFO("mask " << to_string(sm));
    Tensor x = randn({2, 3, 4}, DType::float64, gen);
    x.requires_grad_();
    const Array<double> r = xt::random::rand<double>(sm, 0.0, 1.0);
    const MaskArray mask = r > 0.5;
    const Tensor y = masked_fill(x, mask, -7.5);
    sum(y * f64({1.0, 2.0, 3.0, 4.0})).backward();
    const std::size_t lead = 3 - sm.size();
    elements += 24;
    for (std::size_t i = 0; i < 2; ++i)
      for (std::size_t j = 0; j < 3; ++j)
        for (std::size_t k = 0; k < 4; ++k) {
          const std::size_t at[3] = {i, j, k};
          std::size_t m = 0;
          for (std::size_t d = lead; d < 3; ++d) m = m * sm[d - lead] + (sm[d - lead] == 1 ? 0 : at[d]);
          const bool fill = mask.data()[m];
          filled += fill;
          CHECK(y.value<double>()(i, j, k) == (fill ? -7.5 : x.value<double>()(i, j, k)));
          CHECK(x.grad().value<double>()(i, j, k) == (fill ? 0.0 : double(k + 1)));
        }
  }
  CHECK(filled > elements / 4);  // both kinds of element, often
  CHECK(filled < elements * 3 / 4);
}
