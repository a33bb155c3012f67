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

TEST_CASE("sum, mean and max of tensors with a zero dimension follow PyTorch") {
  for (const Shape& shape : {Shape{0, 0}, Shape{0, 3}, Shape{2, 0, 3}, Shape{3, 0}}) {
    INFO("shape " << to_string(shape));
    Tensor x(Array<double>::from_shape(shape), true);
    // The sum of nothing is 0, and its gradient is an empty tensor of x's shape.
    const Tensor total = sum(x);
    CHECK(total.shape() == Shape{});
    CHECK(total.item() == 0.0);
    total.backward();
    CHECK(x.grad().shape() == shape);
    // Over the last axis: one output per row; a row of nothing sums to 0.
    Shape rows(shape.begin(), shape.end() - 1);
    const Tensor row_sums = sum(x, {-1});
    CHECK(row_sums.shape() == rows);
    for (double v : row_sums.value<double>()) CHECK(v == 0.0);
    // The max of nothing has no value: an error naming the op, as in PyTorch, whenever a reduced
    // axis is empty. The mean of nothing is an error too where PyTorch gives NaN; a mean with no
    // output element is empty.
    CHECK_THAT(invalid_argument_message([&] { max(x); }), Contains("max") && Contains(to_string(shape)));
    if (shape.back() == 0) {
      if (rows[0] != 0) CHECK_THAT(invalid_argument_message([&] { mean(x, {-1}); }), Contains("mean"));
      if (rows[0] == 0) CHECK(mean(x, {-1}).shape() == rows);
      CHECK_THAT(invalid_argument_message([&] { max(x, {-1}); }), Contains("max"));
    } else {
      CHECK(mean(x, {-1}).shape() == rows);
      Tensor m = max(x, {-1});
      CHECK(m.shape() == rows);
      x.zero_grad();
      sum(m).backward();
      CHECK(x.grad().shape() == shape);
    }
  }
}
