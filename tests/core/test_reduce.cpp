#include "tests/helpers.hpp"

using namespace qkv;
using namespace qkv::test;
using Catch::Matchers::Contains;

namespace {
// (2,2,3): x[i][j][k] = 100 i + 10 j + k.
Tensor cube() { return f64({{{0, 1, 2}, {10, 11, 12}}, {{100, 101, 102}, {110, 111, 112}}}); }
}  // namespace

TEST_CASE("sum over each axis, with and without keepdim") {
  check_close(sum(cube(), {0}), {{100, 102, 104}, {120, 122, 124}});
  check_close(sum(cube(), {1}), {{10, 12, 14}, {210, 212, 214}});
  check_close(sum(cube(), {2}), {{3, 33}, {303, 333}});
  check_close(sum(cube(), {-1}, true), shaped({3, 33, 303, 333}, {2, 2, 1}));
  check_close(sum(cube(), {0, 2}), {306, 366});
  check_close(sum(cube()), Array<double>(672.0));
  CHECK(sum(cube(), {1}, true).shape() == Shape{2, 1, 3});
  CHECK(sum(cube(), {}, true).shape() == Shape{1, 1, 1});
}

TEST_CASE("mean and max over axes") {
  check_close(mean(cube(), {0}), {{50, 51, 52}, {60, 61, 62}});
  check_close(mean(cube(), {2}, true), shaped({1, 11, 101, 111}, {2, 2, 1}));
  check_close(mean(cube()), Array<double>(56.0));
  check_close(max(cube(), {1}), {{10, 11, 12}, {110, 111, 112}});
  check_close(max(cube(), {0, 1}, true), {{{110, 111, 112}}});
  check_close(max(f64({{3, -1}, {-5, 2}})), Array<double>(3.0));
}

TEST_CASE("reduction gradients broadcast back over the reduced axes") {
  Tensor x = f64({{1, 2, 3}, {4, 5, 6}}, true);
  sum(sum(x, {1}) * f64({1, 10})).backward();
  check_close(x.grad(), {{1, 1, 1}, {10, 10, 10}});
  x.zero_grad();
  sum(mean(x, {0}, true) * f64({{1, 2, 3}})).backward();
  check_close(x.grad(), {{0.5, 1, 1.5}, {0.5, 1, 1.5}});
}

TEST_CASE("max sends its gradient to the maximum, split equally among ties") {
  Tensor x = f64({{1, 5, 5}, {7, 0, 2}}, true);
  sum(max(x, {1})).backward();
  check_close(x.grad(), {{0, 0.5, 0.5}, {1, 0, 0}});
}

TEST_CASE("reduction errors name the op and the axis") {
  const Tensor x = zeros({2, 3}, DType::float64);
  CHECK(invalid_argument_message([&] { sum(x, {2}); }) == "sum: axis 2 out of range for a tensor with 2 dimensions");
  CHECK_THAT(invalid_argument_message([&] { mean(x, {1, -1}); }), Contains("mean: axis listed twice"));
  CHECK_THAT(invalid_argument_message([] { max(zeros({2, 0}, DType::float64), {1}); }),
             Contains("max: reducing over an empty axis"));
}
