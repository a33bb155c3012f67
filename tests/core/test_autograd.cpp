#include "tests/helpers.hpp"

using namespace qkv;
using namespace qkv::test;
using Catch::Matchers::Contains;

namespace {
// loss = Σ (x ⊙ w)²: d loss / d w = 2 x² w, d loss / d x = 2 w² x.
Tensor quadratic_loss(const Tensor& x, const Tensor& w) { return sum(pow(x * w, 2.0)); }
}  // namespace

TEST_CASE("backward fills the gradients of leaves that require grad") {
  Tensor x = f64({1, 2, 3});
  Tensor w = f64({0.5, -1, 2}, true);
  quadratic_loss(x, w).backward();
  check_close(w.grad(), {2 * 1 * 0.5, 2 * 4 * -1.0, 2 * 9 * 2.0});
  CHECK_FALSE(x.grad().defined());  // x does not require grad
}

TEST_CASE("backward twice with zero_grad in between gives the same gradients") {
  Tensor x = f64({1, 2, 3}, true);
  Tensor w = f64({0.5, -1, 2}, true);
  Tensor loss = quadratic_loss(x, w);
  loss.backward(Tensor(), /*retain_graph=*/true);
  const Array<double> first_w = w.grad().value<double>(), first_x = x.grad().value<double>();
  w.zero_grad();
  x.zero_grad();
  CHECK_FALSE(w.grad().defined());
  loss.backward();
  check_close(w.grad(), first_w);
  check_close(x.grad(), first_x);
}

TEST_CASE("without zero_grad a second backward accumulates") {
  Tensor w = f64({0.5, -1, 2}, true);
  Tensor loss = quadratic_loss(f64({1, 2, 3}), w);
  loss.backward(Tensor(), true);
  loss.backward();
  check_close(w.grad(), {2 * 2 * 1 * 0.5, 2 * 2 * 4 * -1.0, 2 * 2 * 9 * 2.0});
}

TEST_CASE("the tape is empty after backward, and kept with retain_graph") {
  Tensor w = f64({1, 2}, true);
  Tensor loss = sum(w * w);
  CHECK(tape_size() == 2);
  loss.backward(Tensor(), true);
  CHECK(tape_size() == 2);
  loss.backward();
  CHECK(tape_size() == 0);
}

TEST_CASE("a second backward without retain_graph says how to fix it") {
  Tensor w = f64({1, 2}, true);
  Tensor loss = sum(w * w);
  loss.backward();
  try {
    loss.backward();
    FAIL("expected a runtime_error");
  } catch (const std::runtime_error& e) {
    CHECK_THAT(e.what(), Contains("retain_graph"));
  }
}

TEST_CASE("under NoGradGuard nothing is recorded") {
  Tensor w = f64({1, 2}, true);
  const std::size_t before = tape_size();
  {
    NoGradGuard no_grad;
    CHECK_FALSE(is_grad_enabled());
    Tensor y = sum(w * w);
    CHECK_FALSE(y.requires_grad());
    CHECK(tape_size() == before);
  }
  CHECK(is_grad_enabled());
  CHECK(sum(w * w).requires_grad());
}

TEST_CASE("a tensor used by two ops receives both contributions") {
  // y = x·x + 3x + exp(x), so dy/dx = 2x + 3 + exp(x).
  Tensor x = f64({0.5, -2}, true);
  sum(x * x + x * 3.0 + exp(x)).backward();
  check_close(x.grad(), {2 * 0.5 + 3 + std::exp(0.5), 2 * -2.0 + 3 + std::exp(-2.0)});
}

TEST_CASE("a sum's gradient handed to its inputs stays theirs alone") {
  // add gives an input with no gradient yet d output itself, not a copy: the other input, and
  // contributions that arrive later, must each still see their own values.
  Tensor a = f64({1, 2}, true), b = f64({3, 4}, true);
  const Tensor w = f64({10, 20});
  const Tensor u = a * 3.0;  // recorded before the sum, so its gradient reaches a after the sum's
  sum((a + b) * w + u).backward();
  check_close(a.grad(), {13, 23});
  check_close(b.grad(), {10, 20});
  Tensor x = f64({1, 2}, true);
  sum((x + x) * w).backward();
  check_close(x.grad(), {20, 40});
  // A second backward adds to the gradients the first one left.
  Tensor y = f64({1, 2}, true), z = f64({5, 6}, true);
  const Tensor s = sum((y + z) * w);
  s.backward({}, true);
  s.backward();
  check_close(y.grad(), {20, 40});
  check_close(z.grad(), {20, 40});
}

TEST_CASE("intermediate tensors keep no gradient after backward") {
  Tensor x = f64({1, 2}, true);
  Tensor h = x * 2.0;
  sum(h * h).backward();
  CHECK_FALSE(h.grad().defined());
  check_close(x.grad(), {8, 16});  // d/dx (2x)² = 8x
}

TEST_CASE("detach stops the gradient") {
  Tensor x = f64({1, 3}, true);
  sum(x.detach() * x).backward();
  check_close(x.grad(), {1, 3});  // not 2x
}

TEST_CASE("forward passes that are never differentiated do not grow the tape") {
  Tensor w = f64({1, 2}, true);
  for (int i = 0; i < 5000; ++i) Tensor unused = sum(w * w);
  CHECK(tape_size() == 0);
}

TEST_CASE("backward needs a gradient for a non-scalar output and a graph to walk") {
  Tensor w = f64({1, 2}, true);
  CHECK_THAT(invalid_argument_message([&] { (w * 2.0).backward(); }), Contains("backward") && Contains("(2)"));
  CHECK_THAT(invalid_argument_message([&] { f64({1.0}).backward(); }), Contains("does not require grad"));
  CHECK_THAT(invalid_argument_message([&] { (w * 2.0).backward(f64({1, 2, 3})); }),
             Contains("(3)") && Contains("(2)"));
  Tensor y = w * 2.0;
  y.backward(f64({1, -1}));
  check_close(w.grad(), {2, -2});
}

TEST_CASE("mixing dtypes in one op throws naming the op and both dtypes") {
  const std::string message = invalid_argument_message([] { add(f32({1, 2}), f64({1, 2})); });
  CHECK_THAT(message, Contains("add") && Contains("float32") && Contains("float64"));
  CHECK_THAT(invalid_argument_message([] { matmul(f64({{1, 2}}), ones({2, 1})); }), Contains("matmul") && Contains("mixed dtypes"));
}

TEST_CASE("anomaly mode: log of a negative number throws naming log") {
  CHECK(std::isnan(log(f64({-1.0})).item()));  // off: NaN, as in PyTorch
  DetectAnomalyGuard anomaly;
  try {
    log(f64({2.0, -1.0}));
    FAIL("expected a runtime_error");
  } catch (const std::runtime_error& e) {
    CHECK_THAT(e.what(), Contains("log") && Contains("NaN"));
  }
  CHECK_THROWS_WITH(log(f64({0.0})), Contains("log") && Contains("-inf"));
}

TEST_CASE("anomaly mode lets -inf masking through and catches an Inf gradient") {
  DetectAnomalyGuard anomaly;
  const MaskArray mask = {false, true};
  Tensor x = f64({1.0, 2.0}, true);
  Tensor p = softmax(masked_fill(x, mask, -INFINITY));  // the -inf comes from the argument
  check_close(p, {1, 0});
  Tensor z = f64({0.0, 1.0}, true);
  Tensor r = sum(sqrt(z));  // the forward is finite; d√z/dz at 0 is not
  CHECK_THROWS_WITH(r.backward(), Contains("sqrt backward"));
  CHECK(tape_size() == 0);
}
