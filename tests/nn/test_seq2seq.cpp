#include "tests/helpers.hpp"

#include <algorithm>
#include <filesystem>

#include <xtensor/xview.hpp>

#include "qkv/core/autograd.hpp"
#include "qkv/core/ops.hpp"
#include "qkv/nn/checkpoint.hpp"
#include "qkv/nn/generate.hpp"
#include "qkv/nn/seq2seq.hpp"
#include "qkv/nn/transformer.hpp"
#include "qkv/optim/adam.hpp"

using namespace qkv;
using namespace qkv::nn;
using Catch::Matchers::Contains;
using qkv::test::runtime_error_message;
using qkv::test::scratch;

namespace {

EncoderDecoderConfig small(bool mlp) {
  return {.src_vocab = 7, .tgt_vocab = 6, .max_src_len = 6, .max_tgt_len = 5, .encoder_layers = 2, .decoder_layers = 2,
          .d_model = 8, .heads = 2, .mlp = mlp, .dtype = DType::float64};
}

// The tensors of `from` whose names start with `prefix`, renamed to start with `to` instead.
StateDict renamed(const StateDict& from, const std::string& prefix, const std::string& to) {
  StateDict out;
  for (const auto& [name, t] : from)
    if (name.starts_with(prefix)) out.emplace_back(to + name.substr(prefix.size()), t);
  return out;
}

StateDict joined(std::initializer_list<StateDict> parts) {
  StateDict out;
  for (const StateDict& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

void zero(Tensor& t) { t.mutable_value<double>().fill(0); }

// A decoder block whose cross-attention writes nothing: its out_proj zeroed, bias too.
void silence_cross_attention(DecoderBlock& b) {
  zero(b.cross_attn.out_proj->weight);
  zero(b.cross_attn.out_proj->bias);
}

const Array<double>& f64(const Tensor& t) { return t.value<double>(); }

}  // namespace

TEST_CASE("EncoderDecoder: its encoder is a bidirectional Transformer, and its decoder a causal one when cross-attention writes nothing") {
  Generator gen(3);
  EncoderDecoder m(small(true), gen);
  const IndexArray source{{0, 3, 6, 4, 2, 5}, {4, 1, 0, 1, 3, 3}}, input{{0, 2, 1, 5, 3}, {0, 1, 4, 2, 2}};
  const MaskArray padding{{true, true, true, true, true, true}, {true, true, true, true, false, false}};
  const StateDict state = m.state_dict();

  // The encoder: the same weights in a bidirectional decoder-only model, whose final LayerNorm is
  // ln_enc, read at its ln_final hook (its head is any of the right shape).
  TransformerConfig e{.vocab_size = 7, .n_classes = 6, .max_len = 6, .causal = false, .layers = 2, .d_model = 8,
                      .heads = 2, .mlp = true, .dtype = DType::float64};
  Generator other(9);
  Transformer encoder(e, other);
  // The weights have the same names below the model's own (encoder.blocks.L.attn.q_proj.weight
  // is blocks.L.attn.q_proj.weight there).
  const StateDict enc = joined({renamed(state, "src_tok.", "tok."), renamed(state, "src_pos.", "pos."),
                                renamed(state, "ln_enc.", "ln_final."), renamed(state, "head.", "head."),
                                renamed(state, "encoder.blocks.", "blocks.")});
  encoder.load_state_dict(enc);
  const EncoderDecoderOutput out = m.forward(source, input, false, padding);
  const ActivationCache cache = encoder.run_with_cache(source, {}, padding);
  CHECK(xt::allclose(f64(out.memory), f64(cache["ln_final.hook_normalized"]), 1e-12, 1e-12));

  // The decoder, with every cross-attention's out_proj zeroed (bias too): a causal decoder-only
  // model with the decoder's weights (its self-attention as attn).
  for (const auto& b : m.decoder) silence_cross_attention(*b);
  TransformerConfig d{.vocab_size = 6, .n_classes = 6, .max_len = 5, .layers = 2, .d_model = 8, .heads = 2, .mlp = true,
                      .dtype = DType::float64};
  Transformer decoder(d, other);
  StateDict dec = joined({renamed(state, "tgt_tok.", "tok."), renamed(state, "tgt_pos.", "pos."),
                          renamed(state, "ln_final.", "ln_final."), renamed(state, "head.", "head.")});
  for (std::size_t l = 0; l < 2; ++l) {
    const std::string from = "decoder.blocks." + std::to_string(l) + ".", to = "blocks." + std::to_string(l) + ".";
    for (const char* part : {"ln1.", "attn.", "ln2.", "mlp."}) dec = joined({dec, renamed(state, from + part, to + part)});
  }
  decoder.load_state_dict(dec);
  CHECK(xt::allclose(f64(m.forward(source, input, false, padding).logits), f64(decoder.forward(input).logits), 1e-12, 1e-12));
  // The source then reaches nothing.
  const IndexArray other_source{{1, 1, 1, 1, 1, 1}, {2, 2, 2, 2, 2, 2}};
  CHECK(f64(m.forward(other_source, input).logits) == f64(m.forward(source, input).logits));
}

TEST_CASE("EncoderDecoder: a decoder position sees no later input, the source through cross-attention, and no padding") {
  Generator gen(4);
  EncoderDecoder m(small(false), gen);
  const IndexArray source{{0, 3, 6, 4, 2, 5}, {4, 1, 0, 1, 3, 3}}, input{{0, 2, 1, 5, 3}, {0, 1, 4, 2, 2}};
  const MaskArray padding{{true, true, true, true, true, true}, {true, true, true, true, false, false}};
  const EncoderDecoderOutput out = m.forward(source, input, true, padding);
  // Later decoder inputs change nothing before them.
  IndexArray later = input;
  later(0, 3) = 1, later(0, 4) = 0, later(1, 4) = 5;
  const Array<double> a = f64(m.forward(source, input, false, padding).logits), b = f64(m.forward(source, later, false, padding).logits);
  CHECK(xt::allclose(f64(out.logits), a, 1e-12, 1e-12));  // with the weights kept, op by op
  CHECK(xt::allclose(xt::view(a, xt::all(), xt::range(0, 3)), xt::view(b, xt::all(), xt::range(0, 3)), 0, 0));
  CHECK_FALSE(xt::allclose(xt::view(a, 0, 3), xt::view(b, 0, 3)));
  // The source matters, except where it is padding.
  IndexArray padded_changed = source, real_changed = source;
  padded_changed(1, 4) = 6, padded_changed(1, 5) = 0;
  real_changed(1, 0) = 6;
  CHECK(f64(m.forward(padded_changed, input, false, padding).logits) == a);
  CHECK_FALSE(xt::allclose(f64(m.forward(real_changed, input, false, padding).logits), a));
  // Cross-attention weights: (B, H, T, S), rows summing to 1, nothing on padding.
  const Array<double>& w = f64(out.cross_attention[1].weights);
  CHECK(w.shape() == std::vector<std::size_t>{2, 2, 5, 6});
  CHECK(xt::allclose(xt::sum(w, {3}), 1.0));
  CHECK(xt::amax(xt::view(w, 1, xt::all(), xt::all(), xt::range(4, 6)))() == 0);
  // Self-attention is causal.
  CHECK(f64(out.decoder_attention[0].weights)(0, 1, 1, 3) == 0);
}

TEST_CASE("EncoderDecoder: hook points in forward order, and a hook on cross-attention's z") {
  Generator gen(5);
  EncoderDecoder m(small(true), gen);
  const std::vector<std::string> names = m.hook_names();
  const auto at = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) - names.begin(); };
  // Per encoder layer a Transformer block's 9 points with the MLP and its attention's 6, then
  // ln_enc's; per decoder layer 11 of its own and 6 of each attention, then ln_final's.
  REQUIRE(names.size() == 2 + 2 * (9 + 6) + 1 + 2 + 2 * (11 + 6 + 6) + 1);
  CHECK(at("encoder.blocks.0.ln1.hook_normalized") + 1 == at("encoder.blocks.0.attn.hook_q"));
  CHECK(at("decoder.blocks.1.ln_cross.hook_normalized") + 1 == at("decoder.blocks.1.cross_attn.hook_q"));
  CHECK(at("decoder.blocks.1.hook_cross_attn_out") + 1 == at("decoder.blocks.1.hook_resid_mid"));
  CHECK(names.front() == "encoder.hook_embed");
  CHECK(at("encoder.blocks.1.hook_resid_post") + 1 == at("ln_enc.hook_normalized"));
  CHECK(at("ln_enc.hook_normalized") + 1 == at("decoder.hook_embed"));
  CHECK(at("decoder.blocks.0.hook_attn_out") < at("decoder.blocks.0.cross_attn.hook_q"));
  CHECK(at("decoder.blocks.0.cross_attn.hook_z") < at("decoder.blocks.0.hook_cross_attn_out"));
  CHECK(at("decoder.blocks.1.hook_resid_post") + 1 == at("ln_final.hook_normalized"));
  CHECK(names.back() == "ln_final.hook_normalized");
  // Each point sits on the path of the weights of the module that holds it.
  const StateDict weights = m.state_dict();
  for (const std::string point : {"decoder.blocks.1.attn.hook_q", "decoder.blocks.0.cross_attn.hook_k", "encoder.blocks.1.attn.hook_v"}) {
    const std::string module = point.substr(0, point.rfind('.') + 1);
    CHECK(std::any_of(weights.begin(), weights.end(), [&](const auto& w) { return w.first.rfind(module + "q_proj.", 0) == 0; }));
  }
  CHECK(std::any_of(weights.begin(), weights.end(), [](const auto& w) { return w.first == "decoder.blocks.1.mlp.fc.weight"; }));
  CHECK_THROWS_WITH(m.add_hook("decoder.blocks.2.cross_attn.hook_z", {}), Contains("no hook point 'decoder.blocks.2.cross_attn.hook_z'"));

  const IndexArray source{{0, 3, 6, 4}}, input{{0, 2, 1}};
  Array<double> keys;
  m.add_hook("decoder.blocks.1.cross_attn.hook_k", [&](const Tensor& k, const std::string&) {
    keys = k.value<double>();  // (B, S, H, d_head): from the memory
    return k;
  });
  m.add_hook("decoder.blocks.1.cross_attn.hook_z", [](const Tensor& z, const std::string&) { return z * 0.0; });
  const Array<double> hooked = f64(m.forward(source, input).logits);
  CHECK(keys.shape() == std::vector<std::size_t>{1, 4, 2, 4});
  m.reset_hooks();
  // Zeroing z is out_proj's bias alone: its weight zeroed.
  zero(m.decoder[1]->cross_attn.out_proj->weight);
  CHECK(xt::allclose(hooked, f64(m.forward(source, input).logits), 1e-12, 1e-12));
}

TEST_CASE("EncoderDecoder: run_with_cache keeps the activations forward computes, run_with_hooks patches one call") {
  Generator gen(8);
  EncoderDecoder m(small(true), gen);
  const IndexArray source{{0, 3, 6, 4, 2, 5}, {4, 1, 0, 1, 3, 3}}, input{{0, 2, 1, 5, 3}, {0, 1, 4, 2, 2}};
  const MaskArray padding{{true, true, true, true, true, true}, {true, true, true, true, false, false}};
  const EncoderDecoderOutput plain = m.forward(source, input, true, padding);
  const EncoderDecoderCache cache = m.run_with_cache(source, input, {}, padding);
  CHECK(cache.activations.size() == m.hook_names().size());
  CHECK(xt::allclose(f64(cache.output.logits), f64(plain.logits), 1e-12, 1e-12));
  // The memory is ln_enc's output; each layer's patterns are the weights forward returns.
  CHECK(xt::allclose(f64(cache["ln_enc.hook_normalized"]), f64(plain.memory), 1e-12, 1e-12));
  for (std::size_t l = 0; l < 2; ++l) {
    const std::string d = "decoder.blocks." + std::to_string(l) + ".";
    CHECK(xt::allclose(f64(cache[d + "cross_attn.hook_pattern"]), f64(plain.cross_attention[l].weights), 1e-12, 1e-12));
    CHECK(xt::allclose(f64(cache[d + "attn.hook_pattern"]), f64(plain.decoder_attention[l].weights), 1e-12, 1e-12));
    CHECK(xt::allclose(f64(cache["encoder.blocks." + std::to_string(l) + ".attn.hook_pattern"]),
                       f64(plain.encoder_attention[l].weights), 1e-12, 1e-12));
  }
  // A list of names keeps those alone; a name that is no point is an error naming it.
  const EncoderDecoderCache two = m.run_with_cache(source, input, {"decoder.hook_embed", "ln_final.hook_normalized"}, padding);
  REQUIRE(two.activations.size() == 2);
  CHECK(two.activations[0].first == "decoder.hook_embed");
  CHECK_THROWS_WITH(m.run_with_cache(source, input, {"decoder.blocks.0.cross_attn.hook_pattern", "decoder.blocks.0.hook_z"}),
                    Contains("EncoderDecoder: no hook point 'decoder.blocks.0.hook_z'"));
  CHECK_THROWS_WITH(m.run_with_hooks(source, input, {{"encoder.blocks.9.attn.hook_z", [](const Tensor& z, const std::string&) { return z; }}}),
                    Contains("no hook point 'encoder.blocks.9.attn.hook_z'"));

  // Patching the whole cross-attention output of layer 1 with the value from another source: the
  // logits are then those of the other source wherever only layer 1's cross-attention read it.
  // With layer 0's cross-attention zeroed too, the source reaches the logits only through layer 1,
  // so patching it gives the other source's logits exactly.
  const IndexArray other{{5, 5, 1, 2, 0, 3}, {2, 6, 6, 0, 1, 1}};
  silence_cross_attention(*m.decoder[0]);
  const EncoderDecoderCache other_cache = m.run_with_cache(other, input, {"decoder.blocks.1.hook_cross_attn_out"}, padding);
  const Tensor patch = other_cache["decoder.blocks.1.hook_cross_attn_out"];
  const EncoderDecoderOutput patched = m.run_with_hooks(
      source, input, {{"decoder.blocks.1.hook_cross_attn_out", [&](const Tensor&, const std::string&) { return patch; }}}, false,
      padding);
  CHECK(xt::allclose(f64(patched.logits), f64(m.forward(other, input, false, padding).logits), 1e-12, 1e-12));
  CHECK_FALSE(xt::allclose(f64(patched.logits), f64(m.forward(source, input, false, padding).logits), 1e-6, 1e-6));
  // The hooks were for that call only.
  CHECK(xt::allclose(f64(m.forward(source, input, false, padding).logits), f64(m.run_with_hooks(source, input, {}, false, padding).logits), 0, 0));
}

TEST_CASE("EncoderDecoder: bad inputs and configs are named") {
  Generator gen(6);
  EncoderDecoder m(small(false), gen);
  IndexArray one_token = xt::zeros<std::int64_t>({1, 1});
  const IndexArray two_rows = xt::zeros<std::int64_t>({2, 1});
  CHECK_THROWS_WITH(m.forward(IndexArray{{0, 7}}, one_token), Contains("source token 7 is outside its vocabulary of 7"));
  CHECK_THROWS_WITH(m.forward(IndexArray{{0, 1}}, IndexArray{{0, 1, 2, 3, 4, 5}}),
                    Contains("decoder input of 6 positions, beyond its 5"));
  CHECK_THROWS_WITH(m.forward(IndexArray{{0, 1}}, two_rows), Contains("a decoder input of 2 sequences for a source of 1"));
  EncoderDecoderConfig c = small(false);
  c.decoder_layers = 0;
  CHECK_THROWS_WITH(EncoderDecoder(c, gen), Contains("is 0: the model needs at least one decoder layer"));
  c = small(false);
  c.heads = 3;
  CHECK_THROWS_WITH(EncoderDecoder(c, gen), Contains("3 does not divide d_model 8"));
}

TEST_CASE("EncoderDecoder: parameter_count counts every parameter of each config") {
  for (bool mlp : {false, true})
    for (QK qk : {QK::untied, QK::tied})
      for (Projection proj : {Projection::learned, Projection::identity})
        for (Positions positions : {Positions::learned, Positions::sinusoidal}) {
          EncoderDecoderConfig c = small(mlp);
          c.qk = qk, c.proj = proj, c.positions = positions, c.decoder_layers = 3;
          Generator gen(1);
          const EncoderDecoder m(c, gen);
          std::size_t elements = 0;
          for (const Tensor& p : m.parameters()) elements += p.numel();
          INFO(to_json(c));
          CHECK(parameter_count(c) == double(elements));
        }
}

TEST_CASE("EncoderDecoder: its config round-trips through JSON, and a bad one is named by field") {
  EncoderDecoderConfig c = small(true);
  c.qk = QK::tied, c.positions = Positions::sinusoidal, c.d_head = 2, c.max_tgt_len = 11;
  const EncoderDecoderConfig back = parse_encoder_decoder_config(to_json(c), "c.json");
  CHECK(to_json(back) == to_json(c));
  CHECK(back.max_tgt_len == 11);
  CHECK(back.d_head == 2);
  CHECK(back.qk == QK::tied);
  const std::string text = to_json(small(true));
  const auto replaced = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    t.replace(t.find(from), from.size(), to);
    return t;
  };
  CHECK_THAT(runtime_error_message([&] { parse_encoder_decoder_config(replaced("\"heads\":2", "\"heads\":3"), "c.json", "model."); }),
             Contains("c.json: 'model.heads'") && Contains("does not divide d_model 8"));
  CHECK_THAT(runtime_error_message([&] { parse_encoder_decoder_config(replaced("\"encoder_layers\":2", "\"encoder_layers\":0"), "c.json"); }),
             Contains("'encoder_layers' is 0, out of range"));
  CHECK_THAT(runtime_error_message([&] { parse_encoder_decoder_config(replaced("\"mlp\":true", "\"mlp\":true,\"extra\":1"), "c.json"); }),
             Contains("'extra' is not a known field"));
  // Either model's reader names the other's config.
  const TransformerConfig t{.vocab_size = 5, .n_classes = 5, .max_len = 4};
  CHECK_THAT(runtime_error_message([&] { parse_encoder_decoder_config(nn::to_json(t), "t.json"); }),
             Contains("'vocab_size' belongs to a decoder-only model's config"));
  CHECK_THAT(runtime_error_message([&] { parse_transformer_config(to_json(c), "c.json"); }),
             Contains("'encoder_layers' belongs to an encoder-decoder's config"));
}

TEST_CASE("EncoderDecoder: a run folder's checkpoint loads back into the same model") {
  const std::string dir = scratch("seq2seq_load");
  EncoderDecoderConfig c = small(true);
  c.dtype = DType::float32;
  Generator gen(4);
  EncoderDecoder model(c, gen);
  optim::Adam adam(model.parameters(), {.lr = 1e-2});
  const IndexArray source{{1, 2, 3, 4}, {6, 5, 0, 0}}, input{{0, 4, 3}, {0, 5, 6 % 6}}, targets{{4, 3, 2}, {5, 0, -100}};
  {
    RunLock lock(dir);
    save_config(dir, c);
    for (std::size_t step = 1; step <= 2; ++step) {
      adam.zero_grad();
      model.loss(model.forward(source, input), targets).backward();
      adam.step();
      save_checkpoint(dir, model, adam.state_dict(), {.step = step});
    }
  }
  const auto loaded = load_encoder_decoder(dir);
  CHECK(to_json(loaded->config()) == to_json(c));
  CHECK(loaded->config().dtype == DType::float32);
  CHECK(xt::all(xt::equal(loaded->forward(source, input).logits.value<float>(), model.forward(source, input).logits.value<float>())));
  CHECK_THAT(runtime_error_message([&] { load_transformer(dir); }), Contains("'model.encoder_layers' belongs to an encoder-decoder"));
  // A config.json that does not fit the weights is named.
  EncoderDecoderConfig wider = c;
  wider.d_model = 16;
  save_config(dir, wider);
  CHECK_THAT(runtime_error_message([&] { load_encoder_decoder(dir); }), Contains("model.safetensors: does not fit the model"));
  wider.src_vocab = TransformerConfig::max_width;
  wider.d_model = TransformerConfig::max_width;
  save_config(dir, wider);
  CHECK_THAT(runtime_error_message([&] { load_encoder_decoder(dir); }), Contains("config.json: the model needs"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("EncoderDecoder: cross-attention learns to reverse a sequence, attending the mirrored position") {
  // Sources of 4–6 tokens of 8; the decoder reads a start token (8) then the reversed source, and
  // predicts the reversed source. Queries from the decoder must find the mirrored encoder position.
  const std::size_t V = 8, start = 8, L = 6;
  EncoderDecoderConfig c{.src_vocab = V, .tgt_vocab = V + 1, .max_src_len = L, .max_tgt_len = L, .encoder_layers = 1,
                         .decoder_layers = 1, .d_model = 32, .heads = 2};
  Generator gen(1);
  EncoderDecoder m(c, gen);
  optim::Adam opt(m.parameters(), {.lr = 3e-3});
  const auto batch = [&](std::size_t B, std::size_t n, Generator& g) {
    IndexArray source = IndexArray::from_shape({B, n}), input = IndexArray::from_shape({B, n}), targets = input;
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t t = 0; t < n; ++t) source(b, t) = std::int64_t(g.next_u64() % V);
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t t = 0; t < n; ++t) {
        targets(b, t) = source(b, n - 1 - t);
        input(b, t) = t == 0 ? std::int64_t(start) : targets(b, t - 1);
      }
    return std::tuple(source, input, targets);
  };
  for (int step = 0; step < 400; ++step) {
    const auto [source, input, targets] = batch(32, 4 + gen.next_u64() % 3, gen);
    opt.zero_grad();
    m.loss(m.forward(source, input), targets).backward();
    opt.step();
  }
  NoGradGuard no_grad;
  Generator held_out(99);
  const auto [source, input, targets] = batch(256, 6, held_out);
  const EncoderDecoderOutput out = m.forward(source, input, true);
  const IndexArray predictions = Transformer::predictions(out.logits);
  CHECK(double(xt::sum(xt::equal(predictions, targets))()) / double(targets.size()) > 0.99);
  // Some cross-attention head puts most of its weight on the mirrored source position.
  const Tensor weights = out.cross_attention[0].weights.to(DType::float64);
  const Array<double>& w = f64(weights);
  double best = 0;
  for (std::size_t h = 0; h < 2; ++h) {
    double on_mirror = 0;
    for (std::size_t b = 0; b < 256; ++b)
      for (std::size_t t = 0; t < 6; ++t) on_mirror += w(b, h, t, 5 - t);
    best = std::max(best, on_mirror / (256 * 6));
  }
  CHECK(best > 0.5);
  // Decoding alone, from the start token: greedy generation writes the reversed source, with and
  // without the cache.
  const IndexArray sources = xt::view(source, xt::range(0, 64), xt::all());
  Generator a(1), b(1);
  const IndexArray cached = generate(m, sources, start, 6, {}, a), recomputed = generate(m, sources, start, 6, {}, b, false);
  const IndexArray reversed = xt::view(targets, xt::range(0, 64), xt::all());
  CHECK(double(xt::sum(xt::equal(cached, reversed))()) / double(reversed.size()) > 0.97);
  CHECK(cached == recomputed);
}
