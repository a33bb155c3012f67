#include "tests/helpers.hpp"

#include <sstream>

#include <nlohmann/json.hpp>
#include <xtensor-blas/xlinalg.hpp>
#include <xtensor/xsort.hpp>
#include <xtensor/xview.hpp>

#include "qkv/analysis/logit_attribution.hpp"
#include "qkv/analysis/path_patching.hpp"
#include "qkv/report/logit_attribution.hpp"
#include "qkv/report/path_patching.hpp"
#include "qkv/report/patching.hpp"
#include "qkv/tasks/evaluate.hpp"
#include "tests/analysis/induction_setup.hpp"

using namespace qkv;
using namespace qkv::analysis;
using namespace qkv::test;
using Catch::Matchers::Contains;

namespace {

// `value` with head `head` (dimension 2) copied from `from`, made by hand with xt::view.
Tensor head_from(const Tensor& value, const Tensor& from, std::size_t head) {
  Array<double> v = value.value<double>();
  xt::view(v, xt::all(), xt::all(), head, xt::all()) = xt::view(from.value<double>(), xt::all(), xt::all(), head, xt::all());
  return Tensor(v);
}

const PathPatching::Path& path_of(const PathPatching& r, std::size_t sl, std::size_t sh, const std::string& input,
                                  std::size_t rl = 0, std::size_t rh = 0) {
  for (const PathPatching::Path& p : r.paths)
    if (p.sender_layer == sl && p.sender_head == sh && p.input == input && (input == "logits" || (p.receiver_layer == rl && p.receiver_head == rh)))
      return p;
  FAIL("no path L" << sl << "H" << sh << " → " << input);
  throw std::logic_error("unreachable");
}

}  // namespace

TEST_CASE("path patching: each path against the same two runs made by hand, and a last-layer sender is its z patched") {
  for (const bool noising : {false, true}) {
    INFO((noising ? "noising" : "denoising"));
    Induction setup(6);
    setup.model = induction_model(6, true);  // with MLPs, which path patching runs rather than holds
    auto& [model, task, corruption] = setup;
    const PathPatching r = path_patch(*model, task, corruption, {.noising = noising, .sequences = 16});
    // Per sender of layer 0: logits, then L1H0 q, k, v, L1H1 q, k, v; per sender of layer 1: logits.
    REQUIRE(r.paths.size() == 2 * 7 + 2);
    CHECK(r.direction == (noising ? "noising" : "denoising"));

    const PatchPair pair = patch_pair(*model, task, corruption, 16, 1);
    const IndexArray& base_tokens = noising ? pair.clean.tokens : pair.corrupt.tokens;
    const IndexArray& source_tokens = noising ? pair.corrupt.tokens : pair.clean.tokens;
    const nn::ActivationCache base = model->run_with_cache(base_tokens);
    const nn::ActivationCache source = model->run_with_cache(source_tokens);
    check_same(r.clean, scored(*model, (noising ? base : source).output, pair.clean));

    // L0H1 into L1H0's q: the base run with L0H1's output from the other run and layer 1's heads
    // held at the base run's; its L1 q, put into the base run at head 0.
    const std::size_t sender = 1;
    nn::Activations step1;
    const nn::NamedHooks hooks = {
        {"blocks.0.attn.hook_z", [&](const Tensor& z, const std::string&) { return head_from(z, source["blocks.0.attn.hook_z"], sender); }},
        {"blocks.1.attn.hook_q", [&](const Tensor& q, const std::string& name) { step1.activations.emplace_back(name, q); return q; }},
        {"blocks.1.attn.hook_z", [&](const Tensor&, const std::string&) { return base["blocks.1.attn.hook_z"]; }}};
    const nn::TransformerOutput direct = model->run_with_hooks(base_tokens, hooks);
    check_same(path_of(r, 0, sender, "logits").patched, scored(*model, direct, pair.clean));
    const nn::ForwardHook put_q = [&](const Tensor& q, const std::string&) { return head_from(q, step1["blocks.1.attn.hook_q"], 0); };
    const PatchScore by_hand = scored(*model, model->run_with_hooks(base_tokens, {{"blocks.1.attn.hook_q", put_q}}), pair.clean);
    check_same(path_of(r, 0, sender, "q", 1, 0).patched, by_hand);
    CHECK(std::abs(by_hand.loss - (noising ? r.clean.loss : r.corrupted.loss)) > 1e-6);  // the path does change the loss

    // A sender in the last layer has only the logits after it: its path is its z patched.
    const Patching z = patch(*model, task, corruption, {.component = PatchComponent::z, .noising = noising, .sequences = 16});
    for (std::size_t h = 0; h < 2; ++h) check_same(path_of(r, 1, h, "logits").patched, z.patched[1][h][0]);
  }
}

TEST_CASE("path patching: heads that share a kv head share their k and v paths, and the report") {
  // Four query heads on two kv heads: heads 0 and 1 read kv head 0, heads 2 and 3 kv head 1.
  nn::TransformerConfig c = tasks::default_options("induction").model;
  c.heads = 4;
  c.kv_heads = 2;
  c.dtype = DType::float64;
  Generator gen(8);
  nn::Transformer model(c, gen);
  const Induction setup(8);
  const PathPatching r = path_patch(model, setup.task, setup.corruption, {.noising = true, .sequences = 16});
  for (const char* x : {"k", "v"}) {
    INFO(x);
    check_same(path_of(r, 0, 0, x, 1, 0).patched, path_of(r, 0, 0, x, 1, 1).patched);
    check_same(path_of(r, 0, 0, x, 1, 2).patched, path_of(r, 0, 0, x, 1, 3).patched);
    CHECK(path_of(r, 0, 0, x, 1, 0).patched.loss != path_of(r, 0, 0, x, 1, 2).patched.loss);
    CHECK(path_of(r, 0, 0, x, 1, 3).receiver_slice == 1);
  }
  // By hand: kv head 1's k in layer 1, taken from the run with L0H0's output from the other run.
  {
    const PatchPair pair = patch_pair(model, setup.task, setup.corruption, 16, 1);
    const nn::ActivationCache clean = model.run_with_cache(pair.clean.tokens), corrupt = model.run_with_cache(pair.corrupt.tokens);
    nn::Activations step1;
    const nn::NamedHooks hooks = {
        {"blocks.0.attn.hook_z", [&](const Tensor& z, const std::string&) { return head_from(z, corrupt["blocks.0.attn.hook_z"], 0); }},
        {"blocks.1.attn.hook_k", [&](const Tensor& k, const std::string& name) { step1.activations.emplace_back(name, k); return k; }},
        {"blocks.1.attn.hook_z", [&](const Tensor&, const std::string&) { return clean["blocks.1.attn.hook_z"]; }}};
    model.run_with_hooks(pair.clean.tokens, hooks);
    const nn::ForwardHook put_k = [&](const Tensor& k, const std::string&) { return head_from(k, step1["blocks.1.attn.hook_k"], 1); };
    check_same(path_of(r, 0, 0, "k", 1, 2).patched, scored(model, model.run_with_hooks(pair.clean.tokens, {{"blocks.1.attn.hook_k", put_k}}), pair.clean));
  }
  CHECK(path_of(r, 0, 0, "q", 1, 0).patched.loss != path_of(r, 0, 0, "q", 1, 1).patched.loss);

  const nlohmann::json j = report::to_json(r);
  REQUIRE(j.at("paths").size() == r.paths.size());
  CHECK(j.at("paths")[2].at("sender") == "L0H0");  // logits, then L1H0's q, k, v
  CHECK(j.at("paths")[2].at("receiver") == "L1H0");
  CHECK(j.at("paths")[2].at("input") == "k");
  CHECK(j.at("paths")[2].at("loss_share").get<double>() == r.loss_share(r.paths[2]));
  std::ostringstream text;
  report::print_path_patching(text, r);
  CHECK_THAT(text.str(), Contains(fmt::format("L0H0    L1H0      k       {:>9}{:>9.4f}", report::percent(r.paths[2].patched.accuracy),
                                              r.paths[2].patched.loss)));
}

TEST_CASE("direct logit attribution: the parts add up to the logit difference, each head's part by hand, and the pointer readout refused") {
  const auto model = induction_model(9, true);
  const tasks::InductionTask task;
  const LogitAttribution a = logit_attribution(*model, task, {.sequences = 8});
  REQUIRE(a.heads.size() == 2);
  REQUIRE(a.heads[0].size() == 2);
  REQUIRE(a.mlp.size() == 2);
  // The logit difference as patching scores it, on the same sequences.
  Generator gen = tasks::held_out_generator(1);
  const tasks::Batch batch = task.sample(8, gen);
  const nn::ActivationCache cache = model->run_with_cache(batch.tokens);
  CHECK(a.logit_diff == Approx(scored(*model, cache.output, batch).logit_diff).epsilon(1e-12));
  CHECK(a.total() == Approx(a.logit_diff).epsilon(1e-10));
  CHECK(std::abs(a.heads[1][1]) > 1e-5);  // at init the heads' parts are small, but not 0

  // L1H1's part by hand: its output from out_proj's weight columns, ln_final's scale from the
  // final stream, the direction from the head's rows, over the scored positions.
  const Array<double> z = cache["blocks.1.attn.hook_z"].value<double>();
  const Array<double> stream = cache["blocks.1.hook_resid_post"].value<double>();
  const Array<double> logits = cache.output.logits.value<double>();
  const Array<double> w_o = model->blocks[1]->attn.out_proj->weight.value<double>();  // (d_model, H·d_v)
  const Array<double> unembed = model->head->weight.value<double>(), gamma = model->ln_final->weight.value<double>();
  const std::size_t dv = z.shape()[3], D = stream.shape()[2];
  double sum = 0;
  std::size_t n = 0;
  for (std::size_t b = 0; b < 8; ++b)
    for (std::size_t t = 0; t < stream.shape()[1]; ++t) {
      const std::int64_t y = batch.targets(b, t);
      if (y < 0) continue;
      Array<double> row = xt::view(logits, b, t, xt::all());
      row(std::size_t(y)) = -1e300;
      const std::size_t other = std::size_t(xt::argmax(row)());
      const Array<double> x = xt::view(stream, b, t, xt::all());
      const double scale = std::sqrt(xt::variance(x)() + 1e-5);
      const Array<double> w_o1 = xt::view(w_o, xt::all(), xt::range(dv, 2 * dv)), z1 = xt::view(z, b, t, 1, xt::all());
      const Array<double> out = xt::linalg::dot(w_o1, z1);
      const double mean = xt::mean(out)();
      for (std::size_t d = 0; d < D; ++d)
        sum += (out(d) - mean) / scale * gamma(d) * (unembed(std::size_t(y), d) - unembed(other, d));
      ++n;
    }
  REQUIRE(n == a.positions);
  CHECK(a.heads[1][1] == Approx(sum / double(n)).epsilon(1e-10));

  const nlohmann::json j = report::to_json(a, "runs/x");
  CHECK(j.at("layers")[1].at("heads")[1].at("logit_diff").get<double>() == a.heads[1][1]);
  CHECK(j.at("total").get<double>() == a.total());
  std::ostringstream text;
  report::print_logit_attribution(text, a);
  CHECK_THAT(text.str(), Contains(fmt::format("L1H1{:>+28.3f}", a.heads[1][1])));

  nn::TransformerConfig pointer = tasks::default_options("brackets").model;
  Generator g(1);
  nn::Transformer brackets(pointer, g);
  CHECK_THROWS_WITH(logit_attribution(brackets, *tasks::make_task("brackets"), {}), Contains("pointer"));
}
