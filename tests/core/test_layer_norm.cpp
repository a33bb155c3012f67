#include "tests/helpers.hpp"

using namespace qkv;
using namespace qkv::test;
using Catch::Matchers::Contains;

TEST_CASE("layer_norm normalises the last dimension, then scales and shifts") {
  // [1,2,3,4]: mean 2.5, biased variance 1.25.
  const double r = 1 / std::sqrt(1.25 + 1e-5);
  check_close(layer_norm(f64({{1, 2, 3, 4}}), Tensor(), Tensor()), {{-1.5 * r, -0.5 * r, 0.5 * r, 1.5 * r}});
  check_close(layer_norm(f64({{1, 2, 3, 4}, {2, 2, 2, 2}}), f64({1, 2, 3, 4}), f64({0, 0, 0, 1})),
              {{-1.5 * r, -1.0 * r, 1.5 * r, 6 * r + 1}, {0, 0, 0, 1}});
}

TEST_CASE("layer_norm's gradient for the affine parameters") {
  // dw = Σ_rows dy ⊙ x̂, db = Σ_rows dy.
  Tensor w = f64({1, 1}, true), b = f64({0, 0}, true);
  const double r = 1 / std::sqrt(1 + 1e-5);  // each row [a−1, a+1] has variance 1
  sum(layer_norm(f64({{0, 2}, {5, 7}}), w, b) * f64({1, 3})).backward();
  check_close(w.grad(), {-2 * r, 6 * r}, 1e-12);
  check_close(b.grad(), {2, 6});
}

TEST_CASE("layer_norm errors name the parameter and shapes") {
  const Tensor x = zeros({2, 4}, DType::float64);
  CHECK(invalid_argument_message([&] { layer_norm(x, zeros({3}, DType::float64), Tensor()); }) ==
        "layer_norm: weight has shape (3) but the input (2,4) needs (4)");
  CHECK_THAT(invalid_argument_message([&] { layer_norm(x, Tensor(), ones({4})); }), Contains("mixed dtypes"));
  CHECK_THAT(invalid_argument_message([&] { layer_norm(x, Tensor(), Tensor(), 0); }), Contains("eps must be positive"));
}
