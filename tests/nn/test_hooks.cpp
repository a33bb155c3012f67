#include "tests/helpers.hpp"

#include <cmath>

#include "qkv/core/ops.hpp"
#include "qkv/nn/transformer.hpp"

using namespace qkv;
using namespace qkv::test;
using Catch::Matchers::Contains;

namespace {

// Two layers with the MLP, two heads of width 4, in float64 so that the op-by-op path of a hooked
// forward and the fused one agree to rounding.
nn::TransformerConfig hooked_config() {
  return {.vocab_size = 7, .n_classes = 5, .max_len = 8, .layers = 2, .d_model = 8, .heads = 2, .mlp = true,
          .dtype = DType::float64};
}

const IndexArray tokens{{0, 3, 1, 6, 2}, {5, 4, 0, 1, 3}};

Array<double> values(const Tensor& t) { return t.to(DType::float64).value<double>(); }

}  // namespace

TEST_CASE("run_with_cache keeps every hook point in forward order, in TransformerLens's shapes") {
  Generator gen(3);
  nn::Transformer m(hooked_config(), gen);
  const nn::ActivationCache cache = m.run_with_cache(tokens);
  std::vector<std::string> names;
  for (const auto& a : cache.activations) names.push_back(a.first);
  REQUIRE(names == m.hook_names());
  const std::vector<std::string> block = {"hook_resid_pre", "ln1.hook_normalized", "attn.hook_q", "attn.hook_k",
                                          "attn.hook_v", "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z",
                                          "hook_attn_out", "hook_resid_mid", "ln2.hook_normalized", "mlp.hook_pre",
                                          "mlp.hook_post", "hook_mlp_out", "hook_resid_post"};
  std::vector<std::string> expected = {"hook_embed", "hook_pos_embed"};
  for (const char* l : {"blocks.0.", "blocks.1."})
    for (const std::string& b : block) expected.push_back(l + b);
  expected.push_back("ln_final.hook_normalized");
  CHECK(names == expected);

  const auto shape = [&](const std::string& name) { return cache[name].shape(); };
  CHECK(shape("hook_embed") == Shape{2, 5, 8});
  CHECK(shape("hook_pos_embed") == Shape{2, 5, 8});
  CHECK(shape("blocks.0.attn.hook_q") == Shape{2, 5, 2, 4});
  CHECK(shape("blocks.0.attn.hook_v") == Shape{2, 5, 2, 4});
  CHECK(shape("blocks.1.attn.hook_attn_scores") == Shape{2, 2, 5, 5});
  CHECK(shape("blocks.1.attn.hook_pattern") == Shape{2, 2, 5, 5});
  CHECK(shape("blocks.1.attn.hook_z") == Shape{2, 5, 2, 4});
  CHECK(shape("blocks.1.mlp.hook_pre") == Shape{2, 5, 32});
  CHECK(shape("blocks.1.hook_resid_post") == Shape{2, 5, 8});
  CHECK_FALSE(cache["hook_embed"].requires_grad());  // detached

  // Each activation from the ones before it, computed here by hand.
  const Array<double> embed = values(cache["hook_embed"]), tok = values(m.tok.weight), pos = values(m.pos->weight);
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t t = 0; t < 5; ++t)
      for (std::size_t d = 0; d < 8; ++d) {
        CHECK(embed(b, t, d) == tok(std::size_t(tokens(b, t)), d));
        CHECK(values(cache["hook_pos_embed"])(b, t, d) == pos(t, d));
        CHECK(values(cache["blocks.0.hook_resid_pre"])(b, t, d) == embed(b, t, d) + pos(t, d));
      }
  for (std::size_t l = 0; l < 2; ++l) {
    const std::string p = "blocks." + std::to_string(l) + ".";
    const Array<double> x = values(cache[p + "ln1.hook_normalized"]), q = values(cache[p + "attn.hook_q"]),
                        k = values(cache[p + "attn.hook_k"]), v = values(cache[p + "attn.hook_v"]),
                        s = values(cache[p + "attn.hook_attn_scores"]), w = values(cache[p + "attn.hook_pattern"]),
                        z = values(cache[p + "attn.hook_z"]);
    const nn::MultiHeadAttention& attn = m.blocks[l]->attn;
    const Array<double> wq = values(attn.q_proj->weight), bq = values(attn.q_proj->bias), wk = values(attn.k_proj->weight),
                        bk = values(attn.k_proj->bias);
    for (std::size_t b = 0; b < 2; ++b)
      for (std::size_t h = 0; h < 2; ++h)
        for (std::size_t i = 0; i < 5; ++i) {
          // q = x W_qᵀ + b_q, head h's slice; and k likewise.
          for (std::size_t e = 0; e < 4; ++e) {
            double qe = bq(h * 4 + e), ke = bk(h * 4 + e);
            for (std::size_t d = 0; d < 8; ++d) qe += x(b, i, d) * wq(h * 4 + e, d), ke += x(b, i, d) * wk(h * 4 + e, d);
            CHECK(std::abs(q(b, i, h, e) - qe) < 1e-12);
            CHECK(std::abs(k(b, i, h, e) - ke) < 1e-12);
          }
          // Causal scores q·k/2 (d_head 4), −inf past the query; the pattern is their softmax; z the
          // pattern's mix of values.
          double total = 0, top = -INFINITY;
          for (std::size_t j = 0; j <= i; ++j) top = std::max(top, s(b, h, i, j));
          for (std::size_t j = 0; j < 5; ++j) {
            double dot = 0;
            for (std::size_t e = 0; e < 4; ++e) dot += q(b, i, h, e) * k(b, j, h, e);
            if (j > i) {
              CHECK(std::isinf(s(b, h, i, j)));
              CHECK(w(b, h, i, j) == 0);
            } else {
              CHECK(std::abs(s(b, h, i, j) - dot / 2) < 1e-12);
              CHECK(std::abs(w(b, h, i, j) - std::exp(s(b, h, i, j) - top) /
                                                 [&] {
                                                   double sum = 0;
                                                   for (std::size_t jj = 0; jj <= i; ++jj) sum += std::exp(s(b, h, i, jj) - top);
                                                   return sum;
                                                 }()) < 1e-12);
            }
            total += w(b, h, i, j);
          }
          CHECK(std::abs(total - 1) < 1e-12);
          for (std::size_t e = 0; e < 4; ++e) {
            double ze = 0;
            for (std::size_t j = 0; j < 5; ++j) ze += w(b, h, i, j) * v(b, j, h, e);
            CHECK(std::abs(z(b, i, h, e) - ze) < 1e-12);
          }
        }
    // The residual stream: pre + attention = mid; mid + MLP = post; post is the next layer's pre.
    check_close(cache[p + "hook_resid_mid"], values(cache[p + "hook_resid_pre"]) + values(cache[p + "hook_attn_out"]));
    check_close(cache[p + "hook_resid_post"], values(cache[p + "hook_resid_mid"]) + values(cache[p + "hook_mlp_out"]));
  }
  check_close(cache["blocks.1.hook_resid_pre"], values(cache["blocks.0.hook_resid_post"]));
  // The output is the model's: the fused forward's logits, to rounding.
  check_close(cache.output.logits, values(m.forward(tokens).logits), 1e-12);
  // Only the points asked for.
  const nn::ActivationCache some = m.run_with_cache(tokens, [](const std::string& n) { return n.ends_with("hook_z"); });
  REQUIRE(some.activations.size() == 2);
  CHECK(some.activations[1].first == "blocks.1.attn.hook_z");
  CHECK_THAT(invalid_argument_message([&] { some["hook_embed"]; }),
             Contains("ActivationCache: no activation 'hook_embed' (it has blocks.0.attn.hook_z, blocks.1.attn.hook_z)"));
}

TEST_CASE("a hook that replaces one head's z ablates that head, and only while it is installed") {
  Generator gen(5);
  nn::Transformer m(hooked_config(), gen);
  const Array<double> clean = values(m.forward(tokens).logits);
  const nn::ActivationCache before = m.run_with_cache(tokens);
  // Zero head 1 of layer 1: its attention output is out_proj of z with that head's slice at 0.
  const Tensor keep = Tensor(Array<double>(xt::xarray<double>{1, 1, 1, 1, 0, 0, 0, 0}));
  const nn::ForwardHook ablate = [&](const Tensor& z, const std::string& name) {
    CHECK(name == "blocks.1.attn.hook_z");
    return z * reshape(keep, {1, 1, 2, 4});
  };
  m.add_hook("blocks.1.attn.hook_z", ablate);
  const nn::ActivationCache after = m.run_with_cache(tokens);
  Array<double> z = values(before["blocks.1.attn.hook_z"]);  // layer 1's input is unchanged by its own ablation
  xt::view(z, xt::all(), xt::all(), 1, xt::all()) = 0.0;
  check_close(after["blocks.1.attn.hook_z"], z);
  const Tensor expected = (*m.blocks[1]->attn.out_proj)(reshape(Tensor(z), {2, 5, 8}));
  check_close(after["blocks.1.hook_attn_out"], values(expected), 1e-12);
  const Array<double> ablated = values(m.forward(tokens).logits);
  CHECK(xt::amax(xt::abs(ablated - clean))() > 1e-3);
  // run_with_hooks adds for one call; reset_hooks removes the model's own.
  m.reset_hooks();
  check_close(m.forward(tokens).logits, clean, 1e-12);
  check_close(m.run_with_hooks(tokens, {{"blocks.1.attn.hook_z", ablate}}).logits, ablated, 1e-12);
  check_close(m.forward(tokens).logits, clean, 1e-12);
}

TEST_CASE("hooks name a wrong point or a replacement of the wrong shape") {
  Generator gen(7);
  nn::Transformer m(hooked_config(), gen);
  const nn::ForwardHook same = [](const Tensor& v, const std::string&) { return v; };
  CHECK_THAT(invalid_argument_message([&] { m.add_hook("blocks.2.attn.hook_q", same); }),
             Contains("Transformer: no hook point 'blocks.2.attn.hook_q'; this model has hook_embed, hook_pos_embed, "
                      "blocks.0.hook_resid_pre"));
  CHECK_THAT(invalid_argument_message([&] { m.add_hook("blocks.0.attn.hook_scores", same); }),
             Contains("no hook point 'blocks.0.attn.hook_scores'"));
  CHECK_THAT(invalid_argument_message([&] {
               m.run_with_hooks(tokens, {{"blocks.0.attn.hook_pattern", [](const Tensor& v, const std::string&) {
                                            return slice(v, 3, 0, 2);
                                          }}});
             }),
             Contains("hooks: the hook on 'blocks.0.attn.hook_pattern' returned float64 (2,2,5,2), where the point holds "
                      "float64 (2,2,5,5)"));
  CHECK_THAT(invalid_argument_message([&] {
               m.run_with_hooks(tokens, {{"hook_embed", [](const Tensor& v, const std::string&) { return v.to(DType::float32); }}});
             }),
             Contains("the hook on 'hook_embed' returned float32 (2,5,8), where the point holds float64 (2,5,8)"));
  // A call that fails, in the model or in a hook, leaves the model's own hooks as they were.
  int calls = 0;
  m.add_hook("blocks.0.hook_resid_post", [&](const Tensor& v, const std::string&) { ++calls; return v; });
  const nn::ForwardHook boom = [](const Tensor&, const std::string&) -> Tensor { throw std::runtime_error("boom"); };
  CHECK_THROWS_WITH(m.run_with_hooks(tokens, {{"blocks.1.hook_resid_post", boom}}), "boom");
  CHECK(calls == 1);
  m.run_with_hooks(tokens, {{"blocks.0.hook_resid_post", same}});
  CHECK(calls == 2);
  m.forward(tokens);
  CHECK(calls == 3);  // still installed, and only it
  m.reset_hooks();
  m.forward(tokens);
  CHECK(calls == 3);
  nn::TransformerConfig pointer = hooked_config();
  pointer.readout = nn::Readout::pointer;
  pointer.n_classes = 0;
  nn::Transformer p(pointer, gen);
  CHECK(p.hook_names().back() == "blocks.1.hook_resid_post");  // no ln_final without the token readout
  // The pointer readout's logits are the hooked scores.
  const Tensor logits = p.run_with_hooks(tokens, {{"blocks.1.attn.hook_attn_scores", [](const Tensor& s, const std::string&) {
                                                     return s * 2.0;
                                                   }}}).logits;
  check_close(logits, values(p.forward(tokens).logits) * 2.0, 1e-12);
}

TEST_CASE("MultiHeadAttention's own hook points: the KV cache's keys are hooked as they arrive") {
  Generator gen(9);
  nn::MultiHeadAttention attn({.d_model = 8, .n_heads = 2, .dtype = DType::float64}, gen);
  CHECK(attn.hook_names() == std::vector<std::string>{"hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z"});
  std::vector<Shape> keys;
  attn.add_hook("hook_k", [&](const Tensor& k, const std::string& name) {
    CHECK(name == "hook_k");
    keys.push_back(k.shape());
    return k;
  });
  const Tensor x = randn({1, 4, 8}, DType::float64, gen);
  nn::KVCache cache;
  attn.forward(slice(x, 1, 0, 3), {.causal = true}, false, &cache);
  const Tensor last = attn.forward(slice(x, 1, 3, 4), {.causal = true}, false, &cache).output;
  CHECK(keys == std::vector<Shape>{{1, 3, 2, 4}, {1, 1, 2, 4}});
  attn.reset_hooks();
  check_close(last, values(slice(attn.forward(x, {.causal = true}).output, 1, 3, 4)), 1e-12);
}

TEST_CASE("hooks under GQA: keys and values per kv head, and a hooked run that changes nothing gives forward's output") {
  nn::TransformerConfig c = hooked_config();
  c.heads = 4;
  c.kv_heads = 2;  // d_head 2; query heads 0, 1 read kv head 0, heads 2, 3 kv head 1
  Generator gen(11);
  nn::Transformer m(c, gen);
  const nn::ActivationCache cache = m.run_with_cache(tokens);
  CHECK(cache["blocks.0.attn.hook_q"].shape() == Shape{2, 5, 4, 2});
  CHECK(cache["blocks.0.attn.hook_k"].shape() == Shape{2, 5, 2, 2});
  CHECK(cache["blocks.0.attn.hook_v"].shape() == Shape{2, 5, 2, 2});
  CHECK(cache["blocks.0.attn.hook_z"].shape() == Shape{2, 5, 4, 2});
  const Array<double> x = values(cache["blocks.0.ln1.hook_normalized"]), v = values(cache["blocks.0.attn.hook_v"]),
                      w = values(cache["blocks.0.attn.hook_pattern"]), z = values(cache["blocks.0.attn.hook_z"]);
  const Array<double> wv = values(m.blocks[0]->attn.v_proj->weight), bv = values(m.blocks[0]->attn.v_proj->bias);
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t t = 0; t < 5; ++t)
      for (std::size_t g = 0; g < 2; ++g)
        for (std::size_t e = 0; e < 2; ++e) {
          double ve = bv(g * 2 + e);  // v = x W_vᵀ + b_v, kv head g
          for (std::size_t d = 0; d < 8; ++d) ve += x(b, t, d) * wv(g * 2 + e, d);
          CHECK(std::abs(v(b, t, g, e) - ve) < 1e-12);
        }
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t h = 0; h < 4; ++h)
      for (std::size_t i = 0; i < 5; ++i)
        for (std::size_t e = 0; e < 2; ++e) {
          double ze = 0;  // head h mixes the values of kv head h / 2
          for (std::size_t j = 0; j < 5; ++j) ze += w(b, h, i, j) * v(b, j, h / 2, e);
          CHECK(std::abs(z(b, i, h, e) - ze) < 1e-12);
        }
  check_close(cache.output.logits, values(m.forward(tokens).logits), 1e-12);
}

TEST_CASE("an unbatched MultiHeadAttention input is hooked with a batch of one, and returned unbatched") {
  Generator gen(13);
  nn::MultiHeadAttention attn({.d_model = 8, .n_heads = 2, .dtype = DType::float64}, gen);
  Shape seen;
  attn.add_hook("hook_z", [&](const Tensor& z, const std::string&) {
    seen = z.shape();
    return z;
  });
  const Tensor x = randn({4, 8}, DType::float64, gen);
  const nn::AttentionResult r = attn.forward(x, {.causal = true}, true);
  CHECK(seen == Shape{1, 4, 2, 4});
  CHECK(r.output.shape() == Shape{4, 8});
  CHECK(r.heads.shape() == Shape{2, 4, 4});
  attn.reset_hooks();
  check_close(r.output, values(attn.forward(x, {.causal = true}).output), 1e-12);
}
