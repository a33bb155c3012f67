#include "tests/helpers.hpp"

#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "qkv/optim/adam.hpp"
#include "qkv/optim/schedule.hpp"
#include "qkv/optim/sgd.hpp"

using namespace qkv;
using namespace qkv::optim;
using namespace qkv::test;
using Catch::Matchers::Contains;
using nlohmann::json;

namespace {

const json& reference() {
  static const json data = [] {
    std::ifstream in(QKV_FIXTURES "/optim_reference.json");
    REQUIRE(in.good());
    return json::parse(in);
  }();
  return data;
}

// L = Σ_k sum(w_k ⊙ (p_k − t_k)²), the problem of tests/fixtures/make_optim_reference.py.
struct Problem {
  std::vector<Tensor> params, weights, targets;
  Tensor loss() const {
    Tensor total = scalar(0, DType::float64);
    for (std::size_t k = 0; k < params.size(); ++k) total = total + sum(weights[k] * pow(params[k] - targets[k], 2.0));
    return total;
  }
};

Tensor from_json(const json& values, const json& shape) {
  Array<double> a = Array<double>::from_shape(shape.get<Shape>());
  std::copy(values.begin(), values.end(), a.begin());
  return Tensor(std::move(a));
}

Problem problem() {
  Problem p;
  for (const json& q : reference()["problem"]) {
    p.params.push_back(from_json(q["init"], q["shape"]).requires_grad_());
    p.weights.push_back(from_json(q["weight"], q["shape"]));
    p.targets.push_back(from_json(q["target"], q["shape"]));
  }
  return p;
}

std::unique_ptr<Optimizer> make(const std::string& kind, const json& o, std::vector<Tensor> params) {
  if (kind == "SGD")
    return std::make_unique<SGD>(params, SGDOptions{.lr = o.value("lr", 1e-3), .momentum = o.value("momentum", 0.0),
                                                   .dampening = o.value("dampening", 0.0),
                                                   .weight_decay = o.value("weight_decay", 0.0),
                                                   .nesterov = o.value("nesterov", false)});
  auto fill = [&](auto& a) {
    a.lr = o.value("lr", a.lr);
    if (o.contains("betas")) a.beta1 = o["betas"][0], a.beta2 = o["betas"][1];
    a.eps = o.value("eps", a.eps);
    a.weight_decay = o.value("weight_decay", a.weight_decay);
    a.amsgrad = o.value("amsgrad", false);
  };
  if (kind == "Adam") {
    AdamOptions a;
    fill(a);
    return std::make_unique<Adam>(params, a);
  }
  AdamWOptions a;
  fill(a);
  return std::make_unique<AdamW>(params, a);
}

void train(Optimizer& opt, const Problem& p, int steps) {
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    p.loss().backward();
    opt.step();
  }
}

}  // namespace

TEST_CASE("every optimizer and option matches torch.optim over five steps") {
  for (const json& c : reference()["cases"]) {
    DYNAMIC_SECTION(c["name"].get<std::string>()) {
      const Problem p = problem();
      auto opt = make(c["optimizer"], c["options"], p.params);
      for (std::size_t step = 0; step < c["trajectory"].size(); ++step) {
        INFO("after step " << step + 1);
        train(*opt, p, 1);
        for (std::size_t k = 0; k < p.params.size(); ++k) {
          INFO("parameter " << k);
          const json& expected = c["trajectory"][step][k];
          check_close(reshape(p.params[k], {-1}), from_json(expected, json::array({expected.size()})).value<double>(), 1e-6);
        }
      }
    }
  }
}

TEST_CASE("Adam and AdamW in float32 match torch.optim's float32 updates and state, given torch's gradients") {
  // 1 − β in float32 would be float32(1) − float32(0.999) = 0.0009999871, 1.3e-5 too small, and
  // exp_avg_sq 1.3e-5 off after one step; torch computes it in double.
  for (const json& c : reference()["float32_cases"]) {
    DYNAMIC_SECTION(c["name"].get<std::string>()) {
      const Problem p64 = problem();
      std::vector<Tensor> params;
      for (const Tensor& q : p64.params) params.push_back(q.to(DType::float32).detach().requires_grad_());
      auto opt = make(c["optimizer"], c["options"], params);
      for (std::size_t step = 0; step < c["steps"].size(); ++step) {
        INFO("after step " << step + 1);
        const json& s = c["steps"][step];
        opt->zero_grad();
        Tensor loss = scalar(0);  // Σ p ⊙ g: its gradient is torch's g, exactly
        for (std::size_t k = 0; k < params.size(); ++k) {
          const std::vector<float> g = s["grads"][k].get<std::vector<float>>();
          Array<float> grad = Array<float>::from_shape({g.size()});
          std::copy(g.begin(), g.end(), grad.begin());
          loss = loss + sum(reshape(params[k], {-1}) * Tensor(std::move(grad)));
        }
        loss.backward();
        opt->step();
        const StateDict state = opt->state_dict();
        const auto buffer = [&](std::size_t k, const std::string& name) {
          for (const auto& [n, t] : state)
            if (n == std::to_string(k) + "." + name) return t;
          FAIL("no " << k << "." << name);
          return Tensor();
        };
        for (std::size_t k = 0; k < params.size(); ++k) {
          INFO("parameter " << k);
          // torch's exp_avg update is one fused multiply-add (its vectorised add with alpha), which
          // can differ by an ulp of m·β1 where m nears 0; exp_avg_sq (a fused add too) adds positive
          // terms only, and 1 − β2 rounded in float32 would put it 1.3e-5 off.
          const auto expect = [&](const Tensor& actual, const json& values, double epsilon, double margin) {
            const std::vector<float> expected = values.get<std::vector<float>>();
            const Array<float> a = reshape(actual, {-1}).value<float>();
            REQUIRE(a.size() == expected.size());
            for (std::size_t i = 0; i < expected.size(); ++i)
              CHECK(double(a(i)) == Approx(expected[i]).epsilon(epsilon).margin(margin));
          };
          expect(params[k], s["params"][k], 1e-6, 1e-7);
          expect(buffer(k, "exp_avg"), s["exp_avg"][k], 1e-6, 1e-8);
          expect(buffer(k, "exp_avg_sq"), s["exp_avg_sq"][k], 2e-6, 0);
        }
      }
    }
  }
}

TEST_CASE("Adam's first step moves each parameter by about lr times the sign of its gradient") {
  Tensor p = f64({1.0, -2.0, 0.5, 3.0}, true);
  Adam opt({p}, {.lr = 0.01});
  const Array<double> before = p.value<double>();
  sum(p * f64({2.0, -0.5, 1e-3, -7.0})).backward();
  opt.step();
  check_close(p.value<double>() - before, {-0.01, 0.01, -0.01, 0.01}, 1e-6);
}

TEST_CASE("parameters that do not require grad, or have no gradient this step, are left alone") {
  Tensor frozen = f64({1.0, 2.0});  // requires_grad false
  Tensor used = f64({1.0, 2.0}, true), unused = f64({3.0, 4.0}, true);
  Adam opt({frozen, used, unused}, {.lr = 0.1});
  sum(used * used).backward();
  opt.step();
  check_close(frozen, {1, 2}, 0);
  check_close(unused, {3, 4}, 0);
  CHECK(used.value<double>()(0) != 1.0);
  const StateDict state = opt.state_dict();
  const auto has = [&](const std::string& name) {
    return std::any_of(state.begin(), state.end(), [&](const auto& e) { return e.first == name; });
  };
  CHECK(has("1.exp_avg"));
  CHECK_FALSE(has("2.exp_avg"));  // never updated: no state, as in PyTorch
  // Its first update, later, is its own step 1: again about lr·sign(g).
  opt.zero_grad();
  sum(unused * f64({-1.0, 1.0})).backward();
  opt.step();
  check_close(unused, {3.1, 3.9}, 1e-6);
}

TEST_CASE("saving an optimizer after k steps and resuming gives bit-identical results") {
  const json options = {{"lr", 0.05}, {"momentum", 0.9}, {"nesterov", true}, {"betas", {0.8, 0.95}}, {"amsgrad", true},
                        {"weight_decay", 0.05}};
  for (const std::string kind : {"SGD", "Adam", "AdamW"}) {
    INFO(kind);
    const Schedule schedule = Schedule::warmup_cosine(0.05, 2, 6, 0.001);
    const auto run = [&](const Problem& p, Optimizer& opt, std::size_t from, std::size_t to) {
      for (std::size_t step = from; step < to; ++step) {
        schedule.apply(opt, step);
        train(opt, p, 1);
      }
    };
    const Problem straight = problem();
    auto opt = make(kind, options, straight.params);
    run(straight, *opt, 0, 6);

    const Problem first = problem();
    auto opt1 = make(kind, options, first.params);
    run(first, *opt1, 0, 3);
    const StateDict saved = opt1->state_dict();
    Problem resumed = problem();  // a fresh model, given the saved weights
    for (std::size_t k = 0; k < resumed.params.size(); ++k) resumed.params[k].copy_(first.params[k]);
    auto opt2 = make(kind, options, resumed.params);
    opt2->load_state_dict(saved);
    run(resumed, *opt2, 3, 6);
    for (std::size_t k = 0; k < straight.params.size(); ++k)
      CHECK(resumed.params[k].value<double>() == straight.params[k].value<double>());
  }
}

TEST_CASE("bad hyperparameters throw naming the value") {
  const std::vector<Tensor> ps{f64({1.0}, true)};
  CHECK(invalid_argument_message([&] { SGD(ps, {.lr = -0.1}); }) == "Optimizer: invalid learning rate lr = -0.1");
  CHECK(invalid_argument_message([&] { Adam(ps, {.lr = -1}); }) == "Optimizer: invalid learning rate lr = -1");
  CHECK_THAT(invalid_argument_message([&] { Adam(ps, {.beta1 = 1.0}); }), Contains("invalid beta1 1"));
  CHECK_THAT(invalid_argument_message([&] { Adam(ps, {.beta2 = -0.5}); }), Contains("invalid beta2 -0.5"));
  CHECK_THAT(invalid_argument_message([&] { Adam(ps, {.eps = 0}); }), Contains("Adam: invalid eps 0"));
  AdamWOptions negative;
  negative.weight_decay = -0.01;
  CHECK_THAT(invalid_argument_message([&] { AdamW(ps, negative); }), Contains("AdamW: invalid weight_decay -0.01"));
  CHECK_THAT(invalid_argument_message([&] { SGD(ps, {.weight_decay = -1}); }), Contains("SGD: invalid weight_decay -1"));
  CHECK_THAT(invalid_argument_message([&] { SGD(ps, {.momentum = 0, .nesterov = true}); }), Contains("nesterov needs"));
}

TEST_CASE("load_state_dict rejects state that does not fit the parameters") {
  const std::vector<Tensor> ps{f64({1.0, 2.0}, true)};
  Adam opt(ps, {});
  CHECK_THAT(invalid_argument_message([&] { opt.load_state_dict({{"0.exp_avg", f64({1.0})}}); }),
             Contains("'0.exp_avg' is float64 (1) but parameter 0 is float64 (2)"));
  CHECK_THAT(invalid_argument_message([&] { opt.load_state_dict({{"3.exp_avg", f64({1.0})}}); }),
             Contains("unexpected entry '3.exp_avg'"));
  CHECK_THAT(invalid_argument_message([&] { opt.load_state_dict({{"0.step", f64({-1.0})}}); }),
             Contains("'0.step' = -1 is not a step count"));
  CHECK_THAT(invalid_argument_message([&] { opt.load_state_dict({{"0.step", f64({2.5})}}); }),
             Contains("'0.step' = 2.5 is not a step count"));
  CHECK_THAT(invalid_argument_message([&] { opt.load_state_dict({{"lr", f64({1.0, 2.0})}}); }),
             Contains("item: the tensor has shape (2), not one element"));
}

TEST_CASE("load_state_dict rejects a parameter's incomplete or repeated state, and changes nothing then") {
  const std::vector<Tensor> ps{f64({1.0, 2.0}, true), f64({3.0}, true)};
  Adam opt(ps, {.lr = 0.5});
  const Tensor m = f64({0.1, 0.2}), v = f64({0.3, 0.4});
  CHECK_THAT(invalid_argument_message([&] { opt.load_state_dict({{"0.step", scalar(3.0, DType::float64)}, {"0.exp_avg", m}}); }),
             Contains("parameter 0 has a step count but no '0.exp_avg_sq'"));
  CHECK_THAT(invalid_argument_message([&] { opt.load_state_dict({{"0.exp_avg", m}, {"0.exp_avg_sq", v}}); }),
             Contains("parameter 0 has '0.exp_avg' but no '0.step'"));
  CHECK_THAT(invalid_argument_message([&] {
               opt.load_state_dict({{"0.step", scalar(3.0, DType::float64)}, {"0.exp_avg", m}, {"0.exp_avg", m}, {"0.exp_avg_sq", v}});
             }),
             Contains("entry '0.exp_avg' appears twice"));
  // max_exp_avg_sq belongs to amsgrad only.
  CHECK_THAT(invalid_argument_message([&] { opt.load_state_dict({{"0.max_exp_avg_sq", v}}); }),
             Contains("unexpected entry '0.max_exp_avg_sq'"));
  CHECK(opt.lr() == 0.5);
  CHECK(opt.state_dict().size() == 1);  // lr alone: no state was taken in
  opt.load_state_dict({{"lr", scalar(0.25, DType::float64)}, {"0.step", scalar(3.0, DType::float64)}, {"0.exp_avg", m}, {"0.exp_avg_sq", v}});
  CHECK(opt.lr() == 0.25);
  CHECK(opt.state_dict().size() == 4);
}

TEST_CASE("clip_grad_norm scales all gradients together and returns the norm before") {
  Tensor a = f64({1.0, 1.0}, true), b = f64({1.0}, true);
  (sum(a * f64({3, 4})) + sum(b * 12.0)).backward();  // gradients (3,4) and (12): norm 13
  CHECK(clip_grad_norm({a, b}, 20) == Approx(13));
  check_close(a.grad(), {3, 4});
  CHECK(clip_grad_norm({a, b}, 6.5) == Approx(13));
  const double scale = 6.5 / (13 + 1e-6);
  check_close(a.grad(), {3 * scale, 4 * scale});
  check_close(b.grad(), {12 * scale});
  clip_grad_value({a, b}, 1.8);  // (1.4999999, 1.9999998) and (5.9999995) clamp to ±1.8
  check_close(a.grad(), {3 * scale, 1.8});
  check_close(b.grad(), {1.8});
  Tensor n = f64({1.0}, true);
  sum(n * f64({NAN})).backward();
  CHECK_THROWS_WITH(clip_grad_norm({n}, 1.0), Contains("clip_grad_norm: the total gradient norm is nan"));
}
