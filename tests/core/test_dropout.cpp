#include "tests/helpers.hpp"

using namespace qkv;
using namespace qkv::test;
using Catch::Matchers::Contains;

TEST_CASE("dropout outside training, or with p = 0, returns its input") {
  const Tensor x = f64({1, 2, 3});
  CHECK(dropout(x, 0.5, false).is_same(x));
  CHECK(dropout(x, 0.0, true).is_same(x));
}

TEST_CASE("dropout zeroes about p of the elements and scales the rest by 1/(1-p)") {
  Generator gen(11);
  const Tensor y = dropout(ones({100000}, DType::float64), 0.25, true, gen);
  std::size_t zeros_seen = 0;
  for (double v : y.value<double>()) {
    if (v == 0) ++zeros_seen;
    else CHECK(v == Approx(4.0 / 3.0));
  }
  CHECK(double(zeros_seen) / 100000 == Approx(0.25).margin(0.006));  // 4.4 standard errors
  check_close(dropout(f64({1, 2}), 1.0, true), {0, 0});
}

TEST_CASE("dropout's mask is reproducible from the seed and is its gradient") {
  Generator g1(3), g2(3);
  Tensor x = f64({1, 2, 3, 4, 5, 6, 7, 8}, true);
  const Tensor a = dropout(x, 0.5, true, g1);
  const Tensor b = dropout(x, 0.5, true, g2);
  CHECK(a.value<double>() == b.value<double>());
  sum(a).backward();
  const Array<double> mask = a.value<double>() / x.value<double>();
  check_close(x.grad(), mask);
}

TEST_CASE("dropout rejects a probability outside 0 to 1") {
  CHECK(invalid_argument_message([] { dropout(f64({1}), 1.5, true); }) == "dropout: probability p must be in [0, 1], got 1.5");
  CHECK_THAT(invalid_argument_message([] { dropout(f64({1}), -0.1, true); }), Contains("-0.1"));
}
