#include "tests/helpers.hpp"

using namespace qkv;
using namespace qkv::test;
using Catch::Matchers::Contains;

TEST_CASE("gradcheck passes a correct gradient and counts what it compared") {
  Tensor x = f64({{0.3, -1.2}, {2.0, 0.7}}, true);
  Tensor w = f64({0.5, -0.25}, true);
  const GradcheckResult r = gradcheck([](const std::vector<Tensor>& in) { return tanh(in[0] * in[1]); }, {x, w});
  CHECK(r.passed);
  CHECK(r.checked == 6);
  CHECK(r.max_abs_error < 1e-8);
  CHECK_FALSE(x.grad().defined());  // cleared afterwards
}

TEST_CASE("gradcheck catches a wrong gradient and names the input, index and both values") {
  // The second term is computed outside the tape, so backward misses its gradient 2·x[1]:
  // along the output direction u, analytic u₁·1 against numeric u₁·(1 + 2·3).
  Tensor x = f64({1.0, 3.0}, true);
  const GradcheckResult r = gradcheck([](const std::vector<Tensor>& in) {
    Tensor hidden;
    {
      NoGradGuard no_grad;
      hidden = in[0] * in[0];
    }
    return in[0] + hidden * f64({0, 1});
  }, {x});
  Generator gen(GradcheckOptions{}.seed);  // u, drawn as gradcheck documents
  const double u1 = randn({2}, DType::float64, gen).value<double>()(1);
  CHECK_FALSE(r.passed);
  CHECK_THAT(r.failure, Contains("input 0 index (1)") && Contains(fmt::format("analytic {:.10g},", u1)) &&
                            Contains("numeric"));
  CHECK(r.max_abs_error == Approx(6 * std::abs(u1)).epsilon(1e-6));  // |u₁·1 − u₁·7|
}

TEST_CASE("gradcheck wants float64 leaves, one of them requiring grad") {
  const auto f = [](const std::vector<Tensor>& in) { return in[0] * 2.0; };
  CHECK_THAT(invalid_argument_message([&] { gradcheck(f, {f32({1.0}, true)}); }), Contains("float64"));
  CHECK_THAT(invalid_argument_message([&] { gradcheck(f, {f64({1})}); }), Contains("no input requires grad"));
}
