#include "tests/helpers.hpp"

#include <algorithm>
#include <sstream>

#include <nlohmann/json.hpp>
#include <xtensor/xview.hpp>

#include "qkv/analysis/detail/tally.hpp"
#include "qkv/analysis/patching.hpp"
#include "qkv/report/patching.hpp"
#include "qkv/tasks/builtin.hpp"
#include "qkv/tasks/evaluate.hpp"
#include "tests/analysis/induction_setup.hpp"
#include "tests/training/short_run.hpp"

using namespace qkv;
using namespace qkv::analysis;
using namespace qkv::test;
using namespace qkv::tasks;
using Catch::Matchers::Contains;

namespace {

// The batch patch draws (seed 1, `n` sequences) and its corruption, drawn apart.
std::pair<Batch, IndexArray> drawn(const Task& task, std::size_t n) {
  Generator gen = held_out_generator(1), corrupt_gen(held_out_generator(1).next_u64());
  const Batch clean = task.sample(n, gen);
  return {clean, task_spec("induction").corruption->make(task, clean, corrupt_gen)};
}

}  // namespace

TEST_CASE("patching: the whole stream patched is the other run, a patch after the last answer changes nothing") {
  const Induction setup(3);
  const auto& [model, task, corruption] = setup;
  PatchOptions o{.component = PatchComponent::resid_pre, .by_position = false, .noising = false, .sequences = 32};
  const Patching denoised = patch(*model, task, corruption, o);
  REQUIRE(denoised.patched.size() == 2);
  REQUIRE(denoised.patched[0].size() == 1);  // a residual component: one row a layer
  CHECK(denoised.clean.loss < denoised.corrupted.loss);
  // Layer 0's resid_pre is all the model reads: patched in whole, the corrupted run is the clean one.
  check_same(denoised.patched[0][0][0], denoised.clean);
  CHECK(denoised.loss_share(0, 0, 0) == Approx(1).epsilon(1e-12));
  o.noising = true;
  const Patching noised = patch(*model, task, corruption, o);
  check_same(noised.patched[0][0][0], noised.corrupted);
  CHECK(noised.direction == "noising");
  o.component = PatchComponent::resid_post;
  o.noising = false;
  check_same(patch(*model, task, corruption, o).patched[1][0][0], denoised.clean);  // the last layer's output

  // By position, in a causal model: the last position feeds only its own output, which is not
  // scored (no token follows it), so patching it there leaves the corrupted run as it was.
  o.component = PatchComponent::resid_pre;
  o.by_position = true;
  const Patching by_position = patch(*model, task, corruption, o);
  REQUIRE(by_position.patched[0][0].size() == by_position.length);
  CHECK(by_position.positions.size() == by_position.length);
  check_same(by_position.patched[0][0][by_position.length - 1], by_position.corrupted);
  CHECK(by_position.loss_share(0, 0, by_position.length - 1) == 0);
  // The second copy is the same in both runs: patching one of its positions changes nothing.
  check_same(by_position.patched[0][0][by_position.length / 2], by_position.corrupted);
}

TEST_CASE("patching: a head's z, q, v and pattern at one position, against the same patch made by hand") {
  const Induction setup(4);
  const auto& model = setup.model;
  const auto& corruption = setup.corruption;
  // Blocks of 6: sequences of 12, so that the pattern's 144 (query, key) pairs, each patched apart
  // in each head, keep the test short under the sanitizers.
  const tasks::InductionTask task(48, 6, 6);
  const auto [clean, corrupt_tokens] = drawn(task, 16);
  const nn::ActivationCache clean_cache = model->run_with_cache(clean.tokens);
  const std::size_t T = clean.tokens.shape()[1], p = T / 2 - 2, h = 1;
  REQUIRE(T == 12);

  for (const PatchComponent c : {PatchComponent::z, PatchComponent::q, PatchComponent::v}) {
    INFO(patch_component_name(c));
    const Patching r = patch(*model, task, corruption,
                             {.component = c, .by_position = true, .noising = false, .sequences = 16});
    REQUIRE(r.patched[1].size() == 2);
    REQUIRE(r.length == T);
    const std::string point = "blocks.1.attn.hook_" + patch_component_name(c);
    const Array<double> from = clean_cache[point].value<double>();
    const nn::ForwardHook by_hand = [&](const Tensor& value, const std::string&) {
      Array<double> v = value.value<double>();
      xt::view(v, xt::all(), p, h, xt::all()) = xt::view(from, xt::all(), p, h, xt::all());
      return Tensor(v);
    };
    check_same(r.patched[1][h][p], scored(*model, model->run_with_hooks(corrupt_tokens, {{point, by_hand}}), clean));
  }

  const Patching pattern = patch(*model, task, corruption,
                                 {.component = PatchComponent::pattern, .by_position = true, .noising = true, .sequences = 16});
  REQUIRE(pattern.patched[1][h].size() == T * T);
  const std::size_t q = T - 3, k = T / 2 - 1;
  const nn::ActivationCache corrupt_cache = model->run_with_cache(corrupt_tokens);
  const Array<double> from = corrupt_cache["blocks.1.attn.hook_pattern"].value<double>();
  const nn::ForwardHook by_hand = [&](const Tensor& value, const std::string&) {
    Array<double> v = value.value<double>();
    xt::view(v, xt::all(), h, q, k) = xt::view(from, xt::all(), h, q, k);
    return Tensor(v);
  };
  check_same(pattern.patched[1][h][q * T + k],
             scored(*model, model->run_with_hooks(clean.tokens, {{"blocks.1.attn.hook_pattern", by_hand}}), clean));
  // A key after the query is masked in both runs: nothing to patch.
  check_same(pattern.patched[1][h][k * T + q], pattern.clean);
}

TEST_CASE("patching: the logit difference, components the model lacks, and the report") {
  const Induction setup(5);
  const auto& [model, task, corruption] = setup;
  // The logit difference of a run, by hand: the target's logit minus the largest other.
  const auto [clean, corrupt_tokens] = drawn(task, 8);
  const nn::TransformerOutput out = model->forward(clean.tokens);
  const Array<double> logits = out.logits.value<double>();
  double margin = 0;
  std::size_t n = 0;
  for (std::size_t b = 0; b < 8; ++b)
    for (std::size_t t = 0; t < clean.tokens.shape()[1]; ++t) {
      const std::int64_t target = clean.targets(b, t);
      if (target < 0) continue;
      Array<double> row = xt::view(logits, b, t, xt::all());
      const double right = row(std::size_t(target));
      row(std::size_t(target)) = -1e300;
      margin += right - xt::amax(row)();
      ++n;
    }
  const Patching r = patch(*model, task, corruption, {.component = PatchComponent::z, .sequences = 8});
  CHECK(r.clean.logit_diff == Approx(margin / double(n)).epsilon(1e-12));

  CHECK_THROWS_WITH(patch(*model, task, corruption, {.component = PatchComponent::mlp_out}),
                    Contains("the component mlp_out needs the MLP, and the model has none"));
  CHECK_THROWS_WITH(patch_component("resid"), Contains("no component 'resid' (one of resid_pre, attn_out"));
  const auto with_mlp = induction_model(5, true);
  const Patching mid = patch(*with_mlp, task, corruption, {.component = PatchComponent::mlp_out, .sequences = 8});
  CHECK(mid.patched.size() == 2);

  const nlohmann::json j = report::to_json(r);
  CHECK(j.at("component") == "z");
  CHECK(j.at("direction") == "denoising");
  CHECK(j.at("layers")[1].at("heads")[1].at("patched")[0].at("loss").get<double>() == r.patched[1][1][0].loss);
  CHECK(j.at("layers")[1].at("heads")[1].at("patched")[0].at("loss_share").get<double>() == r.loss_share(1, 1, 0));
  std::ostringstream text;
  report::print_patching(text, r, false);
  CHECK_THAT(text.str(), Contains(fmt::format("L1H1  {:>9}", fmt::format("{:.1f}%", 100 * r.patched[1][1][0].accuracy))));
  const auto maps = report::patching_heatmaps(r);
  REQUIRE(maps.size() == 1);
  CHECK(maps[0].first == "patch-z");
  CHECK(maps[0].second.values(1, 1) == r.loss_share(1, 1, 0));
}

TEST_CASE("gradients at hook points: a finite difference along a direction, and the parameters' gradients left as they were") {
  const auto model = induction_model(6);
  const InductionTask task;
  const auto [clean, corrupt_tokens] = drawn(task, 4);
  const std::vector<std::string> points = {"blocks.0.hook_resid_pre", "blocks.1.attn.hook_pattern", "blocks.1.attn.hook_v"};
  const auto loss = [&](const nn::TransformerOutput& out) { return model->loss(out, clean.targets); };
  const ActivationGradients g = run_with_gradients(*model, clean.tokens, points, loss);
  REQUIRE(g.gradients.activations.size() == 3);
  for (const Tensor& p : model->parameters()) CHECK_FALSE(p.grad().defined());  // none was there, none is
  {
    // Frozen embeddings stay frozen, and gradients a caller had accumulated stay as they were.
    nn::TransformerConfig c = model->config();
    c.frozen_embeddings = true;
    Generator same(6);
    nn::Transformer other(c, same);
    other.loss(other.forward(clean.tokens), clean.targets).backward();
    std::vector<std::pair<bool, Array<double>>> before;
    for (const Tensor& p : other.parameters())
      before.emplace_back(p.requires_grad(), p.grad().defined() ? p.grad().value<double>() : Array<double>());
    CHECK(std::count_if(before.begin(), before.end(), [](const auto& b) { return !b.first; }) >= 1);
    run_with_gradients(other, clean.tokens, points, [&](const nn::TransformerOutput& out) { return other.loss(out, clean.targets); });
    const std::vector<Tensor> after = other.parameters();
    for (std::size_t i = 0; i < after.size(); ++i) {
      CHECK(after[i].requires_grad() == before[i].first);
      if (before[i].first) check_close(after[i].grad().value<double>(), before[i].second, 0);
    }
  }
  CHECK(g.output.logits.shape() == Shape{4, clean.tokens.shape()[1], 48});
  Generator gen(9);
  for (const std::string& point : points) {
    INFO(point);
    const Array<double> grad = g.gradients[point].value<double>();
    CHECK(grad.shape() == g.activations[point].value<double>().shape());
    // d loss along a random direction D at the point: (loss(A + εD) − loss(A − εD)) / 2ε = Σ grad · D.
    Array<double> d = Array<double>::from_shape(grad.shape());
    for (double& x : d) x = gen.normal();
    const double eps = 1e-5;
    const auto moved = [&](double by) {
      NoGradGuard no_grad;
      const nn::ForwardHook add = [&](const Tensor& value, const std::string&) { return value + Tensor(Array<double>(by * d)); };
      return model->loss(model->run_with_hooks(clean.tokens, {{point, add}}), clean.targets).item();
    };
    const double numeric = (moved(eps) - moved(-eps)) / (2 * eps);
    CHECK(numeric == Approx(xt::sum(grad * d)()).epsilon(1e-6));
  }
  {
    NoGradGuard no_grad;
    CHECK_THROWS_WITH(run_with_gradients(*model, clean.tokens, points, loss), Contains("gradients are disabled"));
  }
  CHECK_THROWS_WITH(run_with_gradients(*model, clean.tokens, {"blocks.9.hook_resid_pre"}, loss), Contains("blocks.9.hook_resid_pre"));
}

TEST_CASE("attribution patching: each estimate is the activation difference times the gradient, summed over what it patches") {
  const Induction setup(7);
  const auto& [model, task, corruption] = setup;
  const Patching r = attribution_patch(*model, task, corruption,
                                       {.component = PatchComponent::z, .by_position = true, .noising = false, .sequences = 8});
  CHECK(r.attribution);
  const auto [clean, corrupt_tokens] = drawn(task, 8);
  const auto loss = [&](const nn::TransformerOutput& out) { return model->loss(out, clean.targets); };
  const std::string point = "blocks.1.attn.hook_z";
  const ActivationGradients at_clean = run_with_gradients(*model, clean.tokens, {point}, loss);
  const ActivationGradients at_corrupt = run_with_gradients(*model, corrupt_tokens, {point}, loss);
  const Array<double> from = at_clean.activations[point].value<double>(), here = at_corrupt.activations[point].value<double>();
  const Array<double> grad = at_corrupt.gradients[point].value<double>();
  const std::size_t p = r.length - 3, h = 0;
  double change = 0;
  for (std::size_t b = 0; b < 8; ++b)
    for (std::size_t i = 0; i < from.shape()[3]; ++i) change += (from(b, p, h, i) - here(b, p, h, i)) * grad(b, p, h, i);
  CHECK(r.patched[1][h][p].loss == Approx(r.corrupted.loss + change).epsilon(1e-12));
  CHECK(std::isnan(r.patched[1][h][p].accuracy));
  // The pattern at one (query, key) pair, summed over the batch alone; resid_pre at one position,
  // over the batch and the stream's features.
  const Patching pattern = attribution_patch(*model, task, corruption,
                                             {.component = PatchComponent::pattern, .by_position = true, .sequences = 8});
  const Patching resid = attribution_patch(*model, task, corruption,
                                           {.component = PatchComponent::resid_pre, .by_position = true, .sequences = 8});
  const std::vector<std::string> points = {"blocks.1.attn.hook_pattern", "blocks.1.hook_resid_pre"};
  const ActivationGradients clean_all = run_with_gradients(*model, clean.tokens, points, loss);
  const ActivationGradients corrupt_all = run_with_gradients(*model, corrupt_tokens, points, loss);
  const auto delta = [&](const std::string& point) {
    return Array<double>((clean_all.activations[point].value<double>() - corrupt_all.activations[point].value<double>()) *
                         corrupt_all.gradients[point].value<double>());
  };
  const Array<double> d_pattern = delta(points[0]), d_resid = delta(points[1]);
  const std::size_t q = r.length - 2, k = r.length / 2;
  double pattern_change = 0, resid_change = 0;
  for (std::size_t b = 0; b < 8; ++b) {
    pattern_change += d_pattern(b, h, q, k);
    for (std::size_t i = 0; i < d_resid.shape()[2]; ++i) resid_change += d_resid(b, p, i);
  }
  CHECK(pattern.patched[1][h][q * r.length + k].loss == Approx(pattern.corrupted.loss + pattern_change).epsilon(1e-12));
  CHECK(resid.patched[1][0][p].loss == Approx(resid.corrupted.loss + resid_change).epsilon(1e-12));
  CHECK(r.corrupted.loss == Approx(patch(*model, task, corruption, {.component = PatchComponent::z, .sequences = 8}).corrupted.loss).epsilon(1e-12));
  const nlohmann::json j = report::to_json(r);
  CHECK(j.at("attribution") == true);
  CHECK(j.at("layers")[1].at("heads")[0].at("patched")[p].at("accuracy").is_null());
}
