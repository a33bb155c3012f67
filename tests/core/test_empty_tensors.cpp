// Every op on tensors with a zero dimension: an empty result of the shape PyTorch gives, an empty
// gradient of each input's shape, and no read or write out of bounds (the sanitizer build checks).
#include "tests/helpers.hpp"

using namespace qkv;
using namespace qkv::test;

namespace {

Tensor empty(const Shape& shape, DType dtype = DType::float64) {
  Tensor t = zeros(shape, dtype);
  t.requires_grad_(true);
  return t;
}

// y = f(inputs) has `shape`, and backward of sum(y) gives each input a finite gradient of its own shape.
void check_empty_op(const std::function<Tensor(const std::vector<Tensor>&)>& f, const std::vector<Tensor>& inputs,
                    const Shape& shape) {
  const Tensor y = f(inputs);
  REQUIRE(y.shape() == shape);
  sum(y).backward();
  for (const Tensor& x : inputs) {
    REQUIRE(x.grad().defined());
    CHECK(x.grad().shape() == x.shape());
    CHECK(std::isfinite(sum(x.grad()).item()));
  }
}

}  // namespace

TEST_CASE("elementwise ops and masked_fill on tensors with a zero dimension") {
  for (const DType dtype : {DType::float32, DType::float64}) {
    check_empty_op([](const auto& in) { return in[0] + in[1]; }, {empty({0, 3}, dtype), empty({3}, dtype)}, {0, 3});
    check_empty_op([](const auto& in) { return in[0] * in[1]; }, {empty({2, 0}, dtype), empty({2, 1}, dtype)}, {2, 0});
    check_empty_op([](const auto& in) { return in[0] / (in[1] + 1.0); }, {empty({0}, dtype), empty({0}, dtype)}, {0});
    // An empty row broadcast over rows: its gradient is a sum down rows of nothing.
    check_empty_op([](const auto& in) { return in[0] + in[1]; }, {empty({3, 0}, dtype), empty({0}, dtype)}, {3, 0});
    check_empty_op([](const auto& in) { return in[0] * in[1]; }, {empty({3, 0}, dtype), empty({0}, dtype)}, {3, 0});
    check_empty_op([](const auto& in) { return in[1] - in[0]; }, {empty({2, 3, 0}, dtype), empty({0}, dtype)}, {2, 3, 0});
    for (auto unary : {+[](const Tensor& x) { return exp(x); }, +[](const Tensor& x) { return tanh(x); },
                       +[](const Tensor& x) { return gelu(x); }, +[](const Tensor& x) { return relu(x); },
                       +[](const Tensor& x) { return sqrt(x + 1.0); }, +[](const Tensor& x) { return pow(x, 3); }})
      check_empty_op([&](const auto& in) { return unary(in[0]); }, {empty({2, 0, 3}, dtype)}, {2, 0, 3});
    check_empty_op([](const auto& in) { return masked_fill(in[0], MaskArray::from_shape({0, 4}), 1.0); },
                   {empty({0, 4}, dtype)}, {0, 4});
  }
}

TEST_CASE("matmul and linear with a zero dimension: an inner dimension of 0 gives zeros, as in PyTorch") {
  for (const DType dtype : {DType::float32, DType::float64}) {
    // (2,0) @ (0,3): a sum of nothing per element.
    const Tensor a = empty({2, 0}, dtype), b = empty({0, 3}, dtype);
    const Tensor c = matmul(a, b);
    REQUIRE(c.shape() == Shape{2, 3});
    for (std::size_t i = 0; i < 6; ++i) CHECK(c.to(DType::float64).value<double>().data()[i] == 0.0);
    check_empty_op([](const auto& in) { return matmul(in[0], in[1]); }, {empty({0, 4}, dtype), empty({4, 5}, dtype)},
                   {0, 5});
    check_empty_op([](const auto& in) { return matmul(in[0], in[1]); },
                   {empty({3, 0, 4}, dtype), empty({3, 4, 2}, dtype)}, {3, 0, 2});
    check_empty_op([](const auto& in) { return linear(in[0], in[1], in[2]); },
                   {empty({0, 4}, dtype), empty({5, 4}, dtype), empty({5}, dtype)}, {0, 5});
    check_empty_op([](const auto& in) { return linear(in[0], in[1], in[2]); },
                   {empty({2, 0, 4}, dtype), empty({5, 4}, dtype), empty({5}, dtype)}, {2, 0, 5});
    // A layer with no outputs.
    check_empty_op([](const auto& in) { return linear(in[0], in[1], Tensor()); }, {empty({3, 4}, dtype), empty({0, 4}, dtype)},
                   {3, 0});
  }
}

TEST_CASE("shape ops, layer_norm, embedding, dropout and cross_entropy with a zero dimension") {
  check_empty_op([](const auto& in) { return reshape(in[0], {4, -1}); }, {empty({2, 0, 2})}, {4, 0});
  check_empty_op([](const auto& in) { return transpose(in[0], 0, 2); }, {empty({2, 0, 3})}, {3, 0, 2});
  check_empty_op([](const auto& in) { return slice(in[0], 1, 1, 1); }, {empty({2, 3})}, {2, 0});
  check_empty_op([](const auto& in) { return concat({in[0], in[1]}, 0); }, {empty({0, 3}), empty({2, 3})}, {2, 3});
  check_empty_op([](const auto& in) { return split(in[0], std::vector<std::size_t>{0, 2}, 1)[0]; }, {empty({2, 2})},
                 {2, 0});
  check_empty_op([](const auto& in) { return layer_norm(in[0], in[1], in[2]); },
                 {empty({0, 4}), empty({4}), empty({4})}, {0, 4});
  check_empty_op([](const auto& in) { return embedding(in[0], IndexArray::from_shape({2, 0})); }, {empty({5, 3})},
                 {2, 0, 3});
  Generator gen(1);
  check_empty_op([&](const auto& in) { return dropout(in[0], 0.5, true, gen); }, {empty({0, 3})}, {0, 3});
  // No targets: a loss of 0 (every target ignored, as the op documents), and no gradient.
  check_empty_op([](const auto& in) { return cross_entropy(in[0], IndexArray::from_shape({0})); }, {empty({0, 5})},
                 {});
}

TEST_CASE("scaled_dot_product_attention with no batch, no queries or no keys") {
  for (const DType dtype : {DType::float32, DType::float64}) {
    const auto attend = [](bool causal) {
      return [causal](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], 2, 2, 0.5, causal);
      };
    };
    for (bool causal : {false, true}) {
      INFO("causal " << causal);
      check_empty_op(attend(causal), {empty({0, 3, 4}, dtype), empty({0, 3, 4}, dtype), empty({0, 3, 4}, dtype)},
                     {0, 3, 4});
      check_empty_op(attend(causal), {empty({2, 0, 4}, dtype), empty({2, 0, 4}, dtype), empty({2, 0, 4}, dtype)},
                     {2, 0, 4});
      // Queries that may attend no key get zeros.
      check_empty_op(attend(false), {empty({2, 3, 4}, dtype), empty({2, 0, 4}, dtype), empty({2, 0, 4}, dtype)},
                     {2, 3, 4});
    }
  }
}
