// float32 against float64 on long reductions: qkv's error within twice PyTorch's on the same
// inputs (tests/fixtures/make_float32_error_reference.py draws them and measured PyTorch), up to a
// whole Transformer at T = 600.
#include "tests/helpers.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "qkv/nn/transformer.hpp"

using namespace qkv;
using namespace qkv::test;
using nlohmann::json;

namespace {

const json& torch_case(const std::string& name) {
  static const json data = [] {
    std::ifstream in(QKV_FIXTURES "/float32_error_reference.json");
    REQUIRE(in.good());
    return json::parse(in);
  }();
  return data.at("cases").at(name);
}

// The fixture's LCG: each call the next state's top 24 bits.
struct Lcg {
  std::uint64_t state;
  std::uint64_t next() {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return state >> 40;
  }
};

// The fixture's inputs: its LCG, uniform over [mean − 2, mean + 2) in steps of 2^-22, so that every
// number is exact in float32 and both dtypes see the same values.
Array<double> draw(const json& seed, const Shape& shape, const json& mean) {
  Array<double> a = Array<double>::from_shape(shape);
  Lcg lcg{seed.get<std::uint64_t>()};
  for (double& x : a) x = double(lcg.next()) / 4194304.0 - 2.0 + mean.get<double>();
  return a;
}

Tensor float32(const Array<double>& a) { return f64(a).to(DType::float32).detach(); }

// The fixture's measures of the float32 result's error against float64.
double relative(double y32, long double y64) { return double(std::fabs((y32 - y64) / y64)); }
double max_relative(const Tensor& y32, const Array<long double>& y64) {
  const Array<double> y = y32.to(DType::float64).value<double>();
  double worst = 0;
  for (std::size_t i = 0; i < y.size(); ++i) worst = std::max(worst, relative(y.data()[i], y64.data()[i]));
  return worst;
}
template <class A>
double normwise(const Tensor& y32, const A& y64) {
  const Array<double> y = y32.to(DType::float64).value<double>();
  long double error = 0, largest = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    error = std::max<long double>(error, std::fabs(y.data()[i] - (long double)y64.data()[i]));
    largest = std::max<long double>(largest, std::fabs((long double)y64.data()[i]));
  }
  return double(error / largest);
}

// ‖y32 − y64‖ / ‖y64‖: every element's error counts, not the worst one alone.
double frobenius(const Tensor& y32, const Array<double>& y64) {
  const Array<double> y = y32.to(DType::float64).value<double>();
  long double error = 0, norm = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    const long double d = (long double)y.data()[i] - y64.data()[i];
    error += d * d;
    norm += (long double)y64.data()[i] * y64.data()[i];
  }
  return double(std::sqrt(error / norm));
}

// qkv's error at most twice PyTorch's, or at most `floor`: one rounding of the result itself, which
// no order of summation avoids.
void check_within_twice_torch(double error, double torch_error, double floor) {
  INFO("qkv's error " << error << ", PyTorch's " << torch_error << ", floor " << floor);
  CHECK(error <= std::max(2 * torch_error, floor));
}

std::size_t size(const json& c, const char* key) { return c.at(key).get<std::size_t>(); }

// One unit in the last place of y in float32, relative to y.
double ulp_of(long double y) {
  const float f = float(y);
  return double((std::nextafter(std::fabs(f), INFINITY) - std::fabs(f)) / std::fabs(y));
}

// Per row of x (rows, n): the softmax, in long double.
Array<long double> softmax_rows(const Array<double>& x) {
  const std::size_t rows = x.shape()[0], n = x.shape()[1];
  Array<long double> p = Array<long double>::from_shape(x.shape());
  for (std::size_t r = 0; r < rows; ++r) {
    const double* row = x.data() + r * n;
    const long double m = *std::max_element(row, row + n);
    long double total = 0;
    for (std::size_t j = 0; j < n; ++j) total += p.data()[r * n + j] = std::exp((long double)row[j] - m);
    for (std::size_t j = 0; j < n; ++j) p.data()[r * n + j] /= total;
  }
  return p;
}

}  // namespace

TEST_CASE("float32 sum and mean of 10^6 numbers are within twice PyTorch's error against float64") {
  const json& c = torch_case("sum");
  const std::size_t n = size(c, "n");
  const Array<double> x = draw(c.at("seed"), {n}, c.at("mean"));
  long double exact = 0;
  for (double v : x) exact += v;
  const Tensor x32 = float32(x);
  check_within_twice_torch(relative(sum(x32).item(), exact), c.at("torch_error").get<double>(), ulp_of(exact));
  const long double exact_mean = exact / n;
  check_within_twice_torch(relative(mean(x32).item(), exact_mean), torch_case("mean").at("torch_error").get<double>(),
                           ulp_of(exact_mean));
  // Along an axis, down columns and over axes apart: every sum goes the same way.
  const Tensor rows = reshape(x32, {1000, 1000});
  const Array<double> by_rows = sum(rows, {1}).to(DType::float64).value<double>(),
                      by_columns = sum(rows, {0}).to(DType::float64).value<double>();
  CHECK(relative(xt::sum(by_rows)(), exact) < 1e-6);
  CHECK(relative(xt::sum(by_columns)(), exact) < 1e-6);
  CHECK(relative(sum(reshape(x32, {10, 100, 1000}), {0, 2}).to(DType::float64).value<double>()(0, 0), [&] {
          long double s = 0;  // x[i, 0, k] over i and k
          for (std::size_t i = 0; i < 10; ++i)
            for (std::size_t k = 0; k < 1000; ++k) s += x(i * 100000 + k);
          return s;
        }()) < 1e-6);
}

TEST_CASE("float32 softmax over 50000-long rows is within twice PyTorch's error against float64") {
  const json& c = torch_case("softmax");
  const Array<double> x = draw(c.at("seed"), {size(c, "rows"), size(c, "length")}, c.at("mean"));
  check_within_twice_torch(max_relative(softmax(float32(x), -1), softmax_rows(x)), c.at("torch_error").get<double>(), 0);
}

TEST_CASE("float32 log_softmax's gradient over 50000-long rows is within twice PyTorch's error against float64") {
  const json& c = torch_case("log_softmax_grad");
  const Shape shape{size(c, "rows"), size(c, "length")};
  const Array<double> x = draw(c.at("seed"), shape, c.at("mean")), dy = draw(c.at("grad_seed"), shape, c.at("mean"));
  // dx = dy − softmax(x) Σ_row dy
  const Array<long double> p = softmax_rows(x);
  Array<long double> dx = Array<long double>::from_shape(shape);
  for (std::size_t r = 0; r < shape[0]; ++r) {
    long double total = 0;
    for (std::size_t j = 0; j < shape[1]; ++j) total += dy(r, j);
    for (std::size_t j = 0; j < shape[1]; ++j) dx(r, j) = dy(r, j) - p(r, j) * total;
  }
  const Tensor x32 = float32(x).requires_grad_();
  log_softmax(x32, -1).backward(float32(dy));
  check_within_twice_torch(normwise(x32.grad(), dx), c.at("torch_error").get<double>(), 0);
}

TEST_CASE("float32 cross_entropy over 50257 classes and its gradient are within twice PyTorch's error against float64") {
  const json& c = torch_case("cross_entropy");
  const std::size_t rows = size(c, "rows"), classes = size(c, "classes");
  const Array<double> x = draw(c.at("seed"), {rows, classes}, c.at("mean"));
  IndexArray targets = IndexArray::from_shape({rows});
  // The loss, mean over rows of log Σ_c e^(x_c) − x_target, and its gradient (softmax(x) − onehot) / rows.
  const Array<long double> p = softmax_rows(x);
  Array<long double> dx = p / (long double)rows;
  long double exact = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    const std::size_t t = r * size(c, "target_step") % classes;
    targets(r) = std::int64_t(t);
    exact -= std::log(p(r, t));
    dx(r, t) -= 1.0L / rows;
  }
  exact /= rows;
  const Tensor x32 = float32(x).requires_grad_();
  const Tensor loss = cross_entropy(x32, targets);
  loss.backward();
  // The loss is rounded once to float32 at the end, which hides most of the sum's error; the
  // gradient, exp(x − max − log Σ), carries it into every entry.
  check_within_twice_torch(relative(loss.item(), exact), c.at("torch_error").get<double>(), ulp_of(exact));
  check_within_twice_torch(max_relative(x32.grad(), dx), torch_case("cross_entropy_grad").at("torch_error").get<double>(), 0);
}

TEST_CASE("float32 causal attention over 600 positions is within twice PyTorch's error against float64, values and gradients") {
  const json& c = torch_case("attention");
  const std::size_t T = size(c, "T"), H = size(c, "heads"), d = size(c, "d_head");
  const json& seeds = c.at("seeds");
  std::vector<Tensor> in64, in32;
  for (std::size_t i = 0; i < 3; ++i) {
    const Array<double> a = draw(seeds[i], {1, T, H * d}, c.at("mean"));
    in64.push_back(f64(a, true));
    in32.push_back(float32(a).requires_grad_());
  }
  const Array<double> dout = draw(c.at("grad_seed"), {1, T, H * d}, c.at("mean"));
  const auto attend = [&](const std::vector<Tensor>& x) {
    return scaled_dot_product_attention(x[0], x[1], x[2], H, H, 1 / std::sqrt(double(d)), true);
  };
  const Tensor y64 = attend(in64);
  y64.backward(f64(dout));
  const Tensor y32 = attend(in32);
  y32.backward(float32(dout));
  const json& torch_error = c.at("torch_error");
  check_within_twice_torch(normwise(y32, y64.value<double>()), torch_error.at("output").get<double>(), 0);
  check_within_twice_torch(normwise(in32[0].grad(), in64[0].grad().value<double>()), torch_error.at("dq").get<double>(), 0);
  check_within_twice_torch(normwise(in32[1].grad(), in64[1].grad().value<double>()), torch_error.at("dk").get<double>(), 0);
  check_within_twice_torch(normwise(in32[2].grad(), in64[2].grad().value<double>()), torch_error.at("dv").get<double>(), 0);
}

TEST_CASE("a float32 Transformer at T 600 is within twice PyTorch's error against float64, loss, logits and gradients") {
  // The fixture's model: every parameter offset + scale · its LCG draws, rounded to float32, and the
  // float64 model on the same rounded values; so the error is the float32 model's arithmetic alone.
  const json& c = torch_case("model");
  const std::size_t B = size(c, "B"), T = size(c, "T");
  nn::TransformerConfig config = nn::parse_transformer_config(c.at("config").dump(), "float32_error_reference.json");
  IndexArray tokens = IndexArray::from_shape({B, T}), targets = IndexArray::from_shape({B, T});
  for (auto [ids, seed] : {std::pair{&tokens, c.at("token_seed")}, {&targets, c.at("target_seed")}}) {
    Lcg lcg{seed.get<std::uint64_t>()};
    for (std::int64_t& id : *ids) id = std::int64_t(lcg.next() % config.vocab_size);
  }
  std::map<std::string, Array<double>> values;  // each exact in float32
  for (const json& p : c.at("parameters")) {
    const Array<double> drawn = draw(p.at("seed"), p.at("shape").get<Shape>(), 0.0);
    values[p.at("name")] = float32(Array<double>(p.at("offset").get<double>() + p.at("scale").get<double>() * drawn))
                               .to(DType::float64).value<double>();
  }
  struct Run {
    double loss;
    Array<double> logits;
    std::map<std::string, Tensor> grads;
  };
  const auto run = [&](DType dtype) {
    config.dtype = dtype;
    Generator gen(1);
    nn::Transformer model(config, gen);
    StateDict weights;
    for (const auto& [name, p] : model.state_dict()) weights.emplace_back(name, f64(values.at(name)).to(dtype));
    REQUIRE(weights.size() == values.size());
    model.load_state_dict(weights);
    const nn::TransformerOutput out = model.forward(tokens);
    const Tensor loss = model.loss(out, targets);
    loss.backward();
    Run r{loss.item(), out.logits.to(DType::float64).value<double>(), {}};
    for (const auto& [name, p] : model.named_parameters()) r.grads.emplace(name, p.grad());
    return r;
  };
  const Run r64 = run(DType::float64), r32 = run(DType::float32);
  const json& torch_error = c.at("torch_error");
  check_within_twice_torch(relative(r32.loss, r64.loss), torch_error.at("loss").get<double>(), ulp_of(r64.loss));
  check_within_twice_torch(frobenius(f64(r32.logits), r64.logits), torch_error.at("logits").get<double>(), 0);
  // Every gradient but k_proj's bias, which is 0 in exact arithmetic (the fixture leaves it out).
  CHECK(torch_error.at("grad").size() == r64.grads.size() - config.layers);
  for (const auto& [name, error] : torch_error.at("grad").items()) {
    INFO(name);
    check_within_twice_torch(frobenius(r32.grads.at(name), r64.grads.at(name).value<double>()), error.get<double>(), 0);
  }
}
