#include "tests/helpers.hpp"

using namespace qkv;
using namespace qkv::test;
using Catch::Matchers::Contains;

TEST_CASE("softmax against hand-computed values, along any axis") {
  // e^1, e^2, e^3 normalised.
  check_close(softmax(f64({1, 2, 3})), {0.09003057317038046, 0.24472847105479767, 0.6652409557748219});
  check_close(softmax(f64({{0, 0}, {std::log(3.0), 0}}), 0), {{0.25, 0.5}, {0.75, 0.5}});
  // Max-subtracted: large logits do not overflow.
  check_close(softmax(f64({1000, 1000 + std::log(3.0)})), {0.25, 0.75});
  check_close(softmax(f32({1000, 1000})), {0.5, 0.5}, 1e-7);
}

TEST_CASE("log_softmax is x minus log-sum-exp") {
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  check_close(log_softmax(f64({1, 2, 3})), {1 - lse, 2 - lse, 3 - lse});
  check_close(log_softmax(f64({-1000, 0})), {-1000, 0});
}

TEST_CASE("softmax's gradient: dx = y ⊙ (dy − Σ dy ⊙ y)") {
  Tensor x = f64({1, 2, 3}, true);
  const Array<double> y = softmax(x).value<double>();
  sum(softmax(x) * f64({1, 0, 0})).backward();  // d y_0 / d x_j = y_0 (δ_0j − y_j)
  check_close(x.grad(), {y(0) * (1 - y(0)), -y(0) * y(1), -y(0) * y(2)});
}

TEST_CASE("softmax over a fully masked row gives zeros, a zero gradient and no NaN") {
  Tensor x = f64({{1, 2, 3}, {4, 5, 6}}, true);
  const MaskArray mask = {{false, true, false}, {true, true, true}};  // row 1: every key masked
  Tensor y = softmax(masked_fill(x, mask, -INFINITY));
  const double e = std::exp(2.0);
  check_close(y, {{1 / (1 + e), 0, e / (1 + e)}, {0, 0, 0}});
  sum(y * f64({{1, 2, 3}, {4, 5, 6}})).backward();
  for (double g : x.grad().value<double>()) CHECK_FALSE(std::isnan(g));
  check_close(Array<double>(xt::view(x.grad().value<double>(), 1)), {0, 0, 0});
  CHECK(x.grad().value<double>()(0, 1) == 0);  // masked entry
  CHECK(x.grad().value<double>()(0, 0) != 0);
  // log_softmax: -inf on the masked row, and still a zero gradient.
  Tensor z = f64({{1, 2}}, true);
  Tensor l = log_softmax(masked_fill(z, MaskArray{{true, true}}, -INFINITY));
  CHECK(std::isinf(l.value<double>()(0, 0)));
  sum(masked_fill(l, MaskArray{{true, true}}, 0.0)).backward();
  check_close(z.grad(), {{0, 0}});
}

TEST_CASE("masked_fill writes the value where the mask is true and blocks the gradient there") {
  Tensor x = f64({{1, 2}, {3, 4}}, true);
  const Tensor y = masked_fill(x, MaskArray{true, false}, -7);  // broadcast over rows
  check_close(y, {{-7, 2}, {-7, 4}});
  sum(y * 3.0).backward();
  check_close(x.grad(), {{0, 3}, {0, 3}});
  CHECK(invalid_argument_message([&] { masked_fill(x, MaskArray{true, false, true}, 0); }) ==
        "masked_fill: shapes (2,2) and (3) cannot broadcast (dimension 1 is 2 and 3)");
  const MaskArray three_d = xt::zeros<bool>(Shape{2, 1, 1});  // broadcasts with x, but to (2,2,2)
  CHECK_THAT(invalid_argument_message([&] { masked_fill(x, three_d, 0); }),
             Contains("does not broadcast to the input's shape (2,2)"));
}

TEST_CASE("softmax names a bad axis") {
  CHECK(invalid_argument_message([] { softmax(f64({1, 2}), 1); }) ==
        "softmax: axis 1 out of range for a tensor with 1 dimensions");
}

TEST_CASE("softmax and log_softmax of tensors with a zero dimension are empty, as are their gradients") {
  for (const Shape& shape : {Shape{0, 0}, Shape{0, 3}, Shape{2, 0, 3}, Shape{3, 0}}) {
    for (std::int64_t axis : {0, -1}) {
      INFO("shape " << to_string(shape) << ", axis " << axis);
      for (const DType dtype : {DType::float32, DType::float64}) {
        Tensor x = zeros(shape, dtype);
        x.requires_grad_(true);
        const Tensor y = softmax(x, axis), z = log_softmax(x, axis);
        CHECK(y.shape() == shape);
        CHECK(z.shape() == shape);
        sum(y + z).backward();
        CHECK(x.grad().shape() == shape);
      }
    }
  }
}

TEST_CASE("softmax of more than 16 vectors along every axis, float32 and float64, matches a plain reference") {
  // (3, 7, 5): along axis 0 there are 35 vectors (three blocks of 16, the last part-filled), along
  // axis 1 15, along axis 2 21; every entry is computed independently here, in long double.
  Generator gen(4);
  const Array<double> x = randn({3, 7, 5}, DType::float64, gen).value<double>() * 4.0;
  for (std::size_t axis = 0; axis < 3; ++axis) {
    INFO("axis " << axis);
    Array<double> expected = x;
    const std::size_t len = x.shape()[axis];
    for (std::size_t i = 0; i < x.size(); ++i) {
      std::size_t idx[3] = {i / 35, i / 5 % 7, i % 5};
      long double m = -INFINITY, total = 0;
      for (std::size_t j = 0; j < len; ++j) {
        idx[axis] = j;
        m = std::max<long double>(m, x(idx[0], idx[1], idx[2]));
      }
      for (std::size_t j = 0; j < len; ++j) {
        idx[axis] = j;
        total += std::exp((long double)x(idx[0], idx[1], idx[2]) - m);
      }
      idx[0] = i / 35, idx[1] = i / 5 % 7, idx[2] = i % 5;
      expected.data()[i] = double(std::exp((long double)x(idx[0], idx[1], idx[2]) - m) / total);
    }
    check_close(softmax(f64(x), std::int64_t(axis)), expected, 1e-15);
    check_close(softmax(f32(xt::cast<float>(x)), std::int64_t(axis)), expected, 2e-7);
  }
}
