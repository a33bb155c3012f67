#include "tests/helpers.hpp"

using namespace qkv;
using namespace qkv::test;
using Catch::Matchers::Contains;

TEST_CASE("a tensor reports its dtype, shape and elements") {
  const Tensor t = f32({{1, 2, 3}, {4, 5, 6}});
  CHECK(t.dtype() == DType::float32);
  CHECK(t.shape() == Shape{2, 3});
  CHECK(t.dim() == 2);
  CHECK(t.size(-1) == 3);
  CHECK(t.numel() == 6);
  CHECK(t.value<float>()(1, 2) == 6.0f);
  CHECK_FALSE(t.requires_grad());
  CHECK(t.is_leaf());
}

TEST_CASE("asking for the wrong element type throws naming both dtypes") {
  const Tensor t = f32({1, 2});
  CHECK_THAT(invalid_argument_message([&] { t.value<double>(); }), Contains("float32") && Contains("float64"));
}

TEST_CASE("factories fill the shape and dtype they are given") {
  check_close(zeros({2, 2}, DType::float64), {{0, 0}, {0, 0}});
  check_close(ones({3}), {1, 1, 1});
  check_close(full({2}, 2.5, DType::float64), {2.5, 2.5});
  const Tensor s = scalar(4.0, DType::float64);
  CHECK(s.dim() == 0);
  CHECK(s.item() == 4.0);
  CHECK(zeros_like(f32({{1, 2}})).shape() == Shape{1, 2});
}

TEST_CASE("item needs exactly one element") {
  CHECK(f64({7.0}).item() == 7.0);
  CHECK_THAT(invalid_argument_message([] { f64({1, 2}).item(); }), Contains("item") && Contains("(2)"));
}

TEST_CASE("detach shares the value and drops the history") {
  Tensor x = f64({1, 2}, true);
  Tensor y = x * 2.0;
  Tensor d = y.detach();
  CHECK(d.is_leaf());
  CHECK_FALSE(d.requires_grad());
  CHECK(&d.value<double>() == &y.value<double>());
}

TEST_CASE("requires_grad_ is for leaves only") {
  Tensor x = f64({1, 2}, true);
  Tensor y = x * 2.0;
  CHECK_FALSE(y.is_leaf());
  CHECK_THAT(invalid_argument_message([&] { y.requires_grad_(false); }), Contains("requires_grad_"));
  x.requires_grad_(false);
  CHECK_FALSE(x.requires_grad());
}

TEST_CASE("to converts the dtype and its gradient flows back in the source dtype") {
  Tensor x = f64({0.5, -1.25}, true);
  Tensor y = x.to(DType::float32);
  CHECK(y.dtype() == DType::float32);
  CHECK(y.value<float>()(1) == -1.25f);
  sum(y * 3.0).backward();
  REQUIRE(x.grad().dtype() == DType::float64);
  check_close(x.grad(), {3, 3});
}

TEST_CASE("an undefined tensor is reported as such") {
  Tensor u;
  CHECK_FALSE(u.defined());
  CHECK_THAT(invalid_argument_message([&] { u.shape(); }), Contains("undefined"));
  CHECK_THAT(invalid_argument_message([&] { add(u, f64({1})); }), Contains("add") && Contains("undefined"));
}
