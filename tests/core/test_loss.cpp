#include "tests/helpers.hpp"

#include "qkv/core/random.hpp"
#include "qkv/core/runtime.hpp"

using namespace qkv;
using namespace qkv::test;
using Catch::Matchers::Contains;

TEST_CASE("cross_entropy is the mean negative log-probability of the targets") {
  // Row 0: softmax(1,2,3)[2] = 0.6652409557748219; row 1: uniform over 3 classes.
  const Tensor logits = f64({{1, 2, 3}, {0, 0, 0}});
  check_close(cross_entropy(logits, IndexArray{2, 1}), Array<double>((-std::log(0.6652409557748219) + std::log(3.0)) / 2));
}

TEST_CASE("cross_entropy takes (..., C) logits with the class dimension last") {
  const Tensor logits = f64({{{0, 0}, {0, std::log(3.0)}}});  // (1,2,2)
  check_close(cross_entropy(logits, IndexArray{{0, 1}}), Array<double>((std::log(2.0) - std::log(0.75)) / 2));
}

TEST_CASE("ignored targets leave the mean and get no gradient") {
  Tensor logits = f64({{1, 2, 3}, {5, 5, 5}}, true);
  const Tensor loss = cross_entropy(logits, IndexArray{2, -100});
  check_close(loss, Array<double>(-std::log(0.6652409557748219)));
  loss.backward();
  // d loss / d logits = softmax − onehot for the counted row, over 1 counted row.
  check_close(logits.grad(), {{0.09003057317038046, 0.24472847105479767, 0.6652409557748219 - 1}, {0, 0, 0}});
}

TEST_CASE("when every target is ignored the loss is 0, not NaN") {
  Tensor logits = f64({{1, 2}}, true);
  const Tensor loss = cross_entropy(logits, IndexArray{-1}, -1);
  CHECK(loss.item() == 0);
  loss.backward();
  check_close(logits.grad(), {{0, 0}});
}

TEST_CASE("cross_entropy errors name the target or the shapes at fault") {
  const Tensor logits = zeros({2, 3}, DType::float64);
  CHECK(invalid_argument_message([&] { cross_entropy(logits, IndexArray{0, 3}); }) ==
        "cross_entropy: target 3 at flat index 1 is out of range for 3 classes (ignore_index is -100)");
  CHECK_THAT(invalid_argument_message([&] { cross_entropy(logits, IndexArray{0, -2}); }), Contains("target -2"));
  CHECK_THAT(invalid_argument_message([&] { cross_entropy(logits, IndexArray{0, 1, 2}); }),
             Contains("logits (2,3) need targets of shape (2)") && Contains("got (3)"));
}

TEST_CASE("cross_entropy in float32 (vectorised exp) matches float64, with ignored rows, on 37 rows") {
  Generator gen(3);
  const Tensor logits64 = (randn({37, 5}, DType::float64, gen) * 4.0).detach().requires_grad_();
  IndexArray targets = IndexArray::from_shape({37});
  for (std::size_t i = 0; i < 37; ++i) targets(i) = i % 7 == 3 ? -100 : std::int64_t(i % 5);
  const Tensor loss64 = cross_entropy(logits64, targets);
  loss64.backward();
  const Tensor logits32 = logits64.to(DType::float32).detach().requires_grad_();
  const Tensor loss32 = cross_entropy(logits32, targets);
  loss32.backward();
  CHECK(loss32.item() == Approx(loss64.item()).epsilon(1e-6));
  check_close(logits32.grad(), logits64.grad().value<double>(), 1e-7);
  for (std::size_t c = 0; c < 5; ++c) CHECK(logits32.grad().value<float>()(3, c) == 0.0f);  // row 3 is ignored
}

TEST_CASE("cross_entropy on 600 rows (blocks across threads) matches float64, the same bits on 1 and 2 threads") {
  Generator gen(5);
  const std::size_t N = 600, C = 8;  // three blocks of rows, the last one short
  const Tensor logits64 = (randn({N, C}, DType::float64, gen) * 3.0).detach().requires_grad_();
  IndexArray targets = IndexArray::from_shape({N});
  for (std::size_t i = 0; i < N; ++i) targets(i) = i % 11 == 4 ? -100 : std::int64_t((i * 7) % C);
  const Tensor loss64 = cross_entropy(logits64, targets);
  loss64.backward();
  std::vector<float> losses;
  std::vector<Array<float>> grads;
  for (std::size_t threads : {1, 2}) {
    set_num_threads(threads);
    const Tensor logits32 = logits64.to(DType::float32).detach().requires_grad_();
    const Tensor loss32 = cross_entropy(logits32, targets);
    loss32.backward();
    losses.push_back(loss32.value<float>()());
    grads.push_back(logits32.grad().value<float>());
  }
  set_num_threads(1);
  CHECK(losses[0] == Approx(loss64.item()).epsilon(1e-6));
  check_close(Tensor(grads[0]), logits64.grad().value<double>(), 1e-7);
  CHECK(losses[0] == losses[1]);
  CHECK(bool(grads[0] == grads[1]));
  for (std::size_t c = 0; c < C; ++c) CHECK(grads[0](4, c) == 0.0f);  // row 4 is ignored
}

TEST_CASE("cross_entropy in float32 does not change when every logit is shifted, values and gradients") {
  // Exact: log(1 + e^-10 + e^-12) = 5.154281376216554e-05. float32 rounds log s at the scale of s ≈ 1
  // (PyTorch 1.13 gives 5.1616291e-05 at every shift); adding m = 1000 to log s first would round it
  // at the scale of 1000 instead (6.1035e-05).
  const IndexArray target = {0};
  std::vector<float> losses;
  std::vector<Array<float>> grads;
  for (const float shift : {0.0f, 1000.0f, -1000.0f, 10000.0f}) {
    Tensor x = f32(Array<float>{{10 + shift, 0 + shift, -2 + shift}}, true);
    const Tensor loss = cross_entropy(x, target);
    loss.backward();
    losses.push_back(loss.value<float>()());
    grads.push_back(x.grad().value<float>());
  }
  CHECK(losses[0] == Approx(5.154281376216554e-05).epsilon(2e-3));
  for (std::size_t i = 1; i < losses.size(); ++i) {
    INFO("shift " << i);
    CHECK(losses[i] == losses[0]);
    CHECK(bool(grads[i] == grads[0]));
  }
}
