#include "tests/helpers.hpp"

#include "qkv/nn/attention.hpp"

using namespace qkv;
using namespace qkv::nn;
using namespace qkv::test;
using Catch::Matchers::Contains;

namespace {

class TwoLayer : public Module {
 public:
  explicit TwoLayer(std::uint64_t seed) : gen(seed), first(3, 4, true, DType::float64, gen), second(4, 2, false, DType::float64, gen) {
    register_module("first", first);
    register_module("second", second);
  }
  Tensor forward(const Tensor& x) const { return second(tanh(first(x))); }

  Generator gen;
  Linear first, second;
};

}  // namespace

TEST_CASE("parameters are named by their path in the module tree") {
  TwoLayer m(1);
  std::vector<std::string> names;
  for (const auto& [name, t] : m.named_parameters()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"first.weight", "first.bias", "second.weight"});
  CHECK(m.parameters().size() == 3);
  CHECK(m.parameters()[0].is_same(m.first.weight));
  CHECK(m.state_dict()[2].second.shape() == Shape{2, 4});
}

TEST_CASE("load_state_dict copies values into the parameters") {
  TwoLayer a(1), b(2);
  const Tensor x = f64({{0.5, -1, 2}});
  CHECK(a.forward(x).value<double>() != b.forward(x).value<double>());
  const Tensor b_weight = b.first.weight;
  b.load_state_dict(a.state_dict());
  check_close(b.forward(x), a.forward(x).value<double>(), 0);
  CHECK(b.first.weight.is_same(b_weight));  // the same tensor, new values
}

TEST_CASE("load_state_dict names every missing, unexpected and mis-shaped entry at once") {
  TwoLayer m(1);
  StateDict state = m.state_dict();
  state.erase(state.begin());                                     // no first.weight
  state[0].second = zeros({5}, DType::float64);                   // first.bias of the wrong shape
  state.emplace_back("third.weight", zeros({1}, DType::float64));  // not in the model
  const Array<double> before = m.first.bias.value<double>();
  const std::string message = invalid_argument_message([&] { m.load_state_dict(state); });
  CHECK_THAT(message, Contains("load_state_dict") && Contains("missing first.weight") &&
                          Contains("unexpected third.weight") && Contains("mis-shaped first.bias (given (5), expected (4))"));
  check_close(m.first.bias, before, 0);  // nothing changed
}

TEST_CASE("train and eval reach every submodule, and zero_grad clears every gradient") {
  TwoLayer m(1);
  m.eval();
  CHECK_FALSE(m.is_training());
  CHECK_FALSE(m.second.is_training());
  m.train();
  CHECK(m.first.is_training());
  sum(m.forward(f64({{1, 2, 3}}))).backward();
  CHECK(m.first.weight.grad().defined());
  m.zero_grad();
  for (const Tensor& p : m.parameters()) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("to converts every parameter in place") {
  TwoLayer m(1);
  const Tensor x64 = f64({{0.5, -1, 2}});
  const Array<double> expected = m.forward(x64).value<double>();
  const Tensor weight = m.first.weight;
  m.to(DType::float32);
  CHECK(weight.dtype() == DType::float32);  // the module's own handle sees the change
  CHECK(weight.requires_grad());
  check_close(m.forward(x64.to(DType::float32)), expected, 1e-6);
}
