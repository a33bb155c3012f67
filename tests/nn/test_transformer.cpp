#include "tests/helpers.hpp"

#include <filesystem>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xsort.hpp>

#include "qkv/nn/checkpoint.hpp"
#include "qkv/nn/files.hpp"
#include "qkv/nn/safetensors.hpp"
#include "qkv/nn/transformer.hpp"
#include "qkv/optim/adam.hpp"

using namespace qkv;
using namespace qkv::test;
using Catch::Matchers::Contains;

namespace {

nn::TransformerConfig small_config() {
  return {.vocab_size = 5, .n_classes = 3, .max_len = 6, .layers = 2, .d_model = 8, .heads = 2};
}

std::size_t numel(const nn::Module& m) {
  std::size_t n = 0;
  for (const Tensor& p : m.parameters()) n += p.numel();
  return n;
}

IndexArray indices(const Tensor& t) {
  const Array<double>& v = t.value<double>();
  IndexArray out = IndexArray::from_shape(v.shape());
  std::transform(v.begin(), v.end(), out.begin(), [](double x) { return std::int64_t(x); });
  return out;
}

}  // namespace

TEST_CASE("Transformer logits, loss and every gradient match PyTorch's for token, pointer and bidirectional models") {
  // tests/fixtures/make_transformer_reference.py computed them with torch's functional ops.
  const nn::Safetensors fixture = nn::load_safetensors(QKV_FIXTURES "/transformer_reference.safetensors");
  std::map<std::string, Tensor> tensors(fixture.tensors.begin(), fixture.tensors.end());
  for (const std::string name : {"token", "pointer", "bidirectional"}) {
    INFO(name);
    nn::TransformerConfig config = nn::parse_transformer_config(fixture.metadata.at(name + ".config"), "fixture");
    config.dtype = DType::float64;
    Generator gen(1);
    nn::Transformer model(config, gen);
    StateDict weights;
    for (const auto& [key, value] : model.state_dict()) weights.emplace_back(key, tensors.at(name + "." + key));
    model.load_state_dict(weights);
    const nn::TransformerOutput out = model.forward(indices(tensors.at(name + ".tokens")));
    Array<double> expected = tensors.at(name + ".logits").value<double>();  // -1e300 stands for -inf
    expected = xt::where(expected <= -1e300, -std::numeric_limits<double>::infinity(), expected);
    const Array<double>& logits = out.logits.value<double>();
    CHECK(xt::all(xt::equal(xt::isinf(logits), xt::isinf(expected))));
    check_close(xt::where(xt::isinf(logits), 0.0, logits), xt::where(xt::isinf(expected), 0.0, expected), 1e-12);
    const Tensor loss = model.loss(out, indices(tensors.at(name + ".targets")));
    CHECK(loss.item() == Approx(tensors.at(name + ".loss").item()).epsilon(1e-13));
    loss.backward();
    for (const auto& [key, p] : model.named_parameters()) {
      INFO(key);
      const Array<double>& expected = tensors.at(name + ".grad." + key).value<double>();
      if (!p.grad().defined()) {  // ln_f under the pointer readout: never read
        CHECK(xt::amax(xt::abs(expected))() == 0.0);
        continue;
      }
      check_close(p.grad(), expected, 1e-11);
    }
  }
}

TEST_CASE("parameter_count equals the parameters a model of the config builds") {
  const auto with = [](auto edit) {
    nn::TransformerConfig c = small_config();
    edit(c);
    return c;
  };
  const std::vector<nn::TransformerConfig> configs = {
      small_config(),
      with([](auto& c) { c.mlp = true; }),
      with([](auto& c) { c.qk = nn::QK::tied; }),
      with([](auto& c) { c.proj = nn::Projection::identity; }),
      with([](auto& c) { c.proj = nn::Projection::identity_qk; }),
      with([](auto& c) { c.proj = nn::Projection::frozen; }),
      with([](auto& c) { c.heads = 4; c.kv_heads = 2; }),
      with([](auto& c) { c.heads = 4; c.kv_heads = 1; c.d_head = 3; }),
      with([](auto& c) { c.readout = nn::Readout::pointer; c.n_classes = 0; c.layers = 3; }),
      with([](auto& c) { c.mlp = true; c.d_mlp = 5; c.activation = nn::Activation::relu; }),
      with([](auto& c) { c.mlp = true; c.layer_norm = false; c.attention_bias = false; c.init = nn::Init::normal; }),
      with([](auto& c) { c.layer_norm = false; c.heads = 4; c.kv_heads = 2; c.attention_bias = false; }),
  };
  for (const auto& c : configs) {
    INFO(nn::to_json(c));
    Generator gen(0);
    CHECK(nn::parameter_count(c) == double(numel(nn::Transformer(c, gen))));
  }
  // By hand, for one: tok 5·8 + pos 6·8 + 2 × (ln1 16 + q, k, v 3·72 + out 72) + ln_f 16 + head 27.
  CHECK(nn::parameter_count(small_config()) == 40 + 48 + 2 * (16 + 216 + 72) + 16 + 27);
  // Nanda et al.'s modular-addition model, p = 113: W_E 114·128, W_pos 3·128, W_Q, W_K, W_V, W_O
  // 4·128·128, W_in 512·128 + 512, W_out 128·512 + 128, and W_U 114·128 with a bias of 114 (the
  // paper's has none).
  nn::TransformerConfig paper{.vocab_size = 114, .n_classes = 114, .max_len = 3, .layers = 1, .d_model = 128, .heads = 4,
                              .mlp = true, .d_mlp = 512, .activation = nn::Activation::relu, .layer_norm = false,
                              .attention_bias = false};
  CHECK(nn::parameter_count(paper) == 14592 + 384 + 65536 + (65536 + 512) + (65536 + 128) + (14592 + 114));
}

TEST_CASE("a config that cannot build a model names the field at fault") {
  const auto field = [](auto edit) {
    nn::TransformerConfig c = small_config();
    edit(c);
    try {
      nn::check(c);
    } catch (const nn::ConfigError& e) {
      return e.field;
    }
    return std::string("(none)");
  };
  CHECK(field([](auto&) {}) == "(none)");
  CHECK(field([](auto& c) { c.vocab_size = 0; }) == "vocab_size");
  CHECK(field([](auto& c) { c.n_classes = 0; }) == "n_classes");
  CHECK(field([](auto& c) { c.readout = nn::Readout::pointer; }) == "n_classes");
  CHECK(field([](auto& c) { c.heads = 3; }) == "heads");
  CHECK(field([](auto& c) { c.kv_heads = 3; }) == "kv_heads");
  CHECK(field([](auto& c) { c.heads = 4; c.kv_heads = 3; }) == "kv_heads");
  CHECK(field([](auto& c) { c.heads = 4; c.kv_heads = 2; c.qk = nn::QK::tied; }) == "kv_heads");
  CHECK(field([](auto& c) { c.d_head = 3; c.proj = nn::Projection::identity; }) == "d_head");
  CHECK(field([](auto& c) { c.layers = 0; }) == "layers");
  CHECK(field([](auto& c) { c.qk = nn::QK::symmetric; c.d_head = 1; }) == "d_head");
  CHECK(field([](auto& c) { c.qk = nn::QK::symmetric; c.heads = 8; }) == "d_head");  // d_model 8 / 8 heads = 1
  CHECK(field([](auto& c) { c.qk = nn::QK::symmetric; c.heads = 4; }) == "(none)");  // d_head 2: one of each sign
  CHECK(field([](auto& c) { c.d_mlp = 12; }) == "d_mlp");  // without the MLP
  CHECK(field([](auto& c) { c.activation = nn::Activation::relu; }) == "activation");
  CHECK(field([](auto& c) { c.mlp = true; c.d_mlp = 12; c.activation = nn::Activation::relu; }) == "(none)");

  Generator gen(0);
  nn::TransformerConfig bad = small_config();
  bad.heads = 3;
  CHECK_THROWS_AS(nn::Transformer(bad, gen), nn::ConfigError);
}

TEST_CASE("a config reads back as written, and a bad field is named") {
  nn::TransformerConfig c = small_config();
  c.readout = nn::Readout::pointer;
  c.n_classes = 0;
  c.causal = false;
  c.qk = nn::QK::tied;
  c.proj = nn::Projection::frozen;
  c.scale = false;
  c.mlp = true;
  c.frozen_embeddings = true;
  c.kv_heads = 2;
  c.d_head = 5;
  const nn::TransformerConfig back = nn::parse_transformer_config(nn::to_json(c), "f");
  CHECK(nn::to_json(back) == nn::to_json(c));
  CHECK(back.readout == nn::Readout::pointer);
  CHECK(back.qk == nn::QK::tied);
  CHECK(back.proj == nn::Projection::frozen);
  CHECK(back.d_head == 5);
  CHECK(back.frozen_embeddings);
  c.d_mlp = 7;
  c.activation = nn::Activation::relu;
  c.layer_norm = false;
  c.attention_bias = false;
  c.init = nn::Init::normal;
  const nn::TransformerConfig again = nn::parse_transformer_config(nn::to_json(c), "f");
  CHECK(nn::to_json(again) == nn::to_json(c));
  CHECK((again.d_mlp == 7 && again.activation == nn::Activation::relu && !again.layer_norm && !again.attention_bias &&
         again.init == nn::Init::normal));
  // A config written before these fields reads as the model it was: 4·d_model, GELU, LayerNorm,
  // attention biases, PyTorch's init.
  nlohmann::json older = nlohmann::json::parse(nn::to_json(small_config()));
  for (const char* field : {"d_mlp", "activation", "layer_norm", "attention_bias", "init"}) older.erase(field);
  const nn::TransformerConfig old = nn::parse_transformer_config(older.dump(), "f");
  CHECK(nn::to_json(old) == nn::to_json(small_config()));

  const auto message = [&](const std::string& from, const std::string& to) {
    std::string text = nn::to_json(small_config());
    const auto at = text.find(from);
    REQUIRE(at != std::string::npos);
    return runtime_error_message([&] { nn::parse_transformer_config(text.replace(at, from.size(), to), "c.json", "model."); });
  };
  CHECK(message("\"heads\":2", "\"heads\":-2") == "c.json: 'model.heads' is -2, out of range [1, 1000000]");
  CHECK(message("\"heads\":2", "\"heads\":3") == "c.json: 'model.heads' 3 does not divide d_model 8 (or give d_head)");
  CHECK(message("\"qk\":\"untied\"", "\"qk\":\"both\"") ==
        "c.json: 'model.qk' is 'both'; it must be one of untied, tied, symmetric");
  CHECK(message("\"mlp\":false", "\"mlp\":0") == "c.json: 'model.mlp' must be true or false, not a number");
  CHECK(message("\"mlp\":false", "\"mlp\":false,\"dropout\":0.1") == "c.json: 'model.dropout' is not a known field");
  CHECK(message("\"layers\":2,", "") == "c.json: 'model.layers' is missing");
  CHECK(message("\"activation\":\"gelu\"", "\"activation\":\"tanh\"") ==
        "c.json: 'model.activation' is 'tanh'; it must be one of gelu, relu");
  CHECK(message("\"d_mlp\":0", "\"d_mlp\":4") == "c.json: 'model.d_mlp' is 4, but the model has no MLP (mlp is false)");
  CHECK(message("\"init\":\"uniform\"", "\"init\":\"xavier\"") ==
        "c.json: 'model.init' is 'xavier'; it must be one of uniform, normal");
}

TEST_CASE("without LayerNorm the model reads the stream as it is, and forward_last is forward's last position") {
  nn::TransformerConfig c{.vocab_size = 7, .n_classes = 7, .max_len = 4, .layers = 2, .d_model = 8, .heads = 2,
                          .mlp = true, .d_mlp = 12, .activation = nn::Activation::relu, .layer_norm = false,
                          .attention_bias = false, .dtype = DType::float64};
  Generator gen(3);
  nn::Transformer model(c, gen);
  for (const auto& [name, p] : model.named_parameters()) {
    INFO(name);
    CHECK(name.find("ln") == std::string::npos);
    CHECK_FALSE((name.find("attn") != std::string::npos && name.ends_with(".bias")));
  }
  CHECK_FALSE(model.ln_final);
  CHECK(model.blocks[1]->mlp->fc.weight.size(0) == 12);
  const IndexArray tokens{{0, 3, 1, 6}, {4, 4, 0, 1}, {2, 5, 5, 3}};
  // The first block's attention reads the embedding itself: ln1.hook_normalized is hook_resid_pre.
  const nn::ActivationCache cache = model.run_with_cache(tokens, {"blocks.0.hook_resid_pre", "blocks.0.ln1.hook_normalized",
                                                                  "blocks.1.mlp.hook_pre", "blocks.1.mlp.hook_post"});
  check_close(cache["blocks.0.ln1.hook_normalized"], cache["blocks.0.hook_resid_pre"].value<double>(), 0);
  // ReLU: hook_post is hook_pre with its negative entries 0, and some are.
  const Array<double>& pre = cache["blocks.1.mlp.hook_pre"].value<double>();
  check_close(cache["blocks.1.mlp.hook_post"], xt::maximum(pre, 0.0), 0);
  CHECK(xt::sum(xt::cast<double>(pre < 0))() > 10);

  const Array<double> full = model.forward(tokens).logits.value<double>();
  const nn::TransformerOutput last = model.forward_last(tokens);
  CHECK(last.logits.shape() == Shape{3, 1, 7});
  check_close(last.logits, xt::view(full, xt::all(), xt::range(3, 4), xt::all()), 1e-13);
  c.readout = nn::Readout::pointer;
  c.n_classes = 0;
  nn::Transformer pointer(c, gen);
  CHECK_THROWS_WITH(pointer.forward_last(tokens), Contains("forward_last reads the token readout"));
}

TEST_CASE("forward_last on more sequences than tokens: forward's logits and gradients, each token and position projected once") {
  // 12 sequences of a 5-token vocabulary: layer 0 runs on the 5 · 4 (token, position) rows and
  // gathers them. The reference is forward over every position (its last row), op by op.
  const IndexArray tokens{{0, 3, 1, 4}, {4, 4, 0, 1}, {1, 2, 3, 0}, {2, 2, 2, 2}, {3, 0, 4, 1}, {0, 0, 1, 4},
                          {4, 3, 2, 1}, {1, 1, 0, 3}, {2, 4, 1, 0}, {3, 3, 3, 4}, {0, 2, 4, 2}, {1, 4, 2, 3}};
  IndexArray targets = IndexArray::from_shape({12, 1});
  for (std::size_t b = 0; b < 12; ++b) targets(b, 0) = std::int64_t((3 * b + 1) % 5);
  MaskArray padding = xt::ones<bool>(Shape{12, 4});
  padding(2, 0) = padding(7, 1) = false;
  const auto base = [] {
    return nn::TransformerConfig{.vocab_size = 5, .n_classes = 5, .max_len = 4, .layers = 1, .d_model = 8, .heads = 2,
                                 .mlp = true, .dtype = DType::float64};
  };
  std::vector<std::pair<std::string, nn::TransformerConfig>> configs;
  configs.emplace_back("one layer, ReLU, no LayerNorm, no biases", base());
  configs.back().second.activation = nn::Activation::relu;
  configs.back().second.layer_norm = configs.back().second.attention_bias = false;
  configs.emplace_back("two layers, LayerNorm, bidirectional", base());
  configs.back().second.layers = 2;
  configs.back().second.causal = false;
  configs.emplace_back("tied, sinusoidal positions", base());
  configs.back().second.qk = nn::QK::tied;
  configs.back().second.positions = nn::Positions::sinusoidal;
  configs.emplace_back("symmetric, GQA-free, two layers", base());
  configs.back().second.qk = nn::QK::symmetric;
  configs.back().second.layers = 2;
  for (const auto& [name, c] : configs)
    for (const bool padded : {false, true}) {
      INFO(name << (padded ? ", key padding" : ""));
      const MaskArray mask = padded ? padding : MaskArray();
      Generator gen(11);
      nn::Transformer model(c, gen);
      const nn::TransformerOutput full = model.forward(tokens, false, mask);
      const Tensor reference = slice(full.logits, 1, 3, 4);
      nn::TransformerOutput at_last;
      at_last.logits = reference;
      model.loss(at_last, targets).backward();
      std::map<std::string, Array<double>> grads;
      for (auto& [key, p] : model.named_parameters()) {
        grads[key] = p.grad().value<double>();
        p.zero_grad();
      }
      const std::uint64_t before = nn::detail::gathered_runs();
      const nn::TransformerOutput last = model.forward_last(tokens, mask);
      CHECK(nn::detail::gathered_runs() == before + 1);  // the gathered path, not forward's
      check_close(last.logits, reference.value<double>(), 1e-12);
      model.loss(last, targets).backward();
      for (const auto& [key, p] : model.named_parameters()) {
        INFO(key);
        check_close(p.grad(), grads.at(key), 1e-12);
      }
    }
}

TEST_CASE("forward_last gathers only with more sequences than tokens, every token known and no hook on the way") {
  // Each other case projects every position, as forward does: the same logits, and no gather.
  Generator gen(12);
  nn::Transformer model({.vocab_size = 5, .n_classes = 5, .max_len = 3, .layers = 1, .d_model = 8, .heads = 2, .mlp = true,
                         .dtype = DType::float64},
                        gen);
  IndexArray many = IndexArray::from_shape({6, 3});
  for (std::size_t i = 0; i < many.size(); ++i) many.data()[i] = std::int64_t((7 * i + 2) % 5);
  // The gathers forward_last made on `tokens`; its logits checked against forward's last position.
  const auto gathers_of = [](const nn::Transformer& m, const IndexArray& tokens) {
    const std::uint64_t before = nn::detail::gathered_runs();
    const nn::TransformerOutput last = m.forward_last(tokens);
    const Tensor reference = slice(m.forward(tokens).logits, 1, 2, 3);
    check_close(last.logits, reference.value<double>(), 1e-12);
    return nn::detail::gathered_runs() - before;
  };
  const auto gathers = [&](const IndexArray& tokens) { return gathers_of(model, tokens); };
  CHECK(gathers(many) == 1);
  const IndexArray few = xt::view(many, xt::range(0, 5), xt::all());  // 5 sequences, 5 tokens
  CHECK(gathers(few) == 0);
  const nn::ForwardHook same = [](const Tensor& x, const std::string&) { return x; };
  for (nn::HookPoint* point : {&model.hook_embed, &model.hook_pos_embed, &model.blocks[0]->hook_resid_pre,
                               &model.blocks[0]->ln1_normalized, &model.blocks[0]->attn.hook_q}) {
    point->add(same);
    CHECK(gathers(many) == 0);
    point->clear();
  }
  CHECK(gathers(many) == 1);
  for (const nn::Projection projection : {nn::Projection::identity, nn::Projection::identity_qk}) {
    INFO(int(projection));
    Generator g(13);
    nn::Transformer fixed({.vocab_size = 5, .n_classes = 5, .max_len = 3, .layers = 1, .d_model = 8, .heads = 2,
                           .proj = projection, .mlp = true, .dtype = DType::float64},
                          g);
    CHECK(gathers_of(fixed, many) == 0);  // no q or v projection to run on the table
  }
  IndexArray unknown = many;
  unknown(4, 1) = 5;  // outside the vocabulary: the embedding's error, which a gather would not give
  const std::uint64_t before = nn::detail::gathered_runs();
  CHECK_THROWS_WITH(model.forward_last(unknown), Contains("index 5 at flat position 13 is out of range"));
  CHECK(nn::detail::gathered_runs() == before);
}

TEST_CASE("the normal init draws weights N(0, 1/d_model), the head's N(0, 1/n_classes), biases 0") {
  nn::TransformerConfig c{.vocab_size = 300, .n_classes = 40, .max_len = 50, .layers = 1, .d_model = 64, .heads = 4,
                          .mlp = true, .init = nn::Init::normal};
  Generator gen(5);
  nn::Transformer model(c, gen);
  std::size_t weights = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    INFO(name);
    const Array<double> v = p.to(DType::float64).value<double>();
    if (name.find("ln") != std::string::npos) {  // LayerNorms as ever
      CHECK(xt::all(xt::equal(v, name.ends_with("weight") ? 1.0 : 0.0)));
    } else if (name.ends_with(".bias")) {
      CHECK(xt::amax(xt::abs(v))() == 0.0);
    } else {
      // Each has at least 2,000 entries: the sample sd is within 5% of the drawn one.
      const double sd = name == "head.weight" ? 1 / std::sqrt(40.0) : 1 / std::sqrt(64.0);
      CHECK(v.size() >= 2000);
      CHECK(std::sqrt(xt::variance(v)()) == Approx(sd).epsilon(0.05));
      CHECK(std::abs(xt::mean(v)()) < 0.1 * sd);
      ++weights;
    }
  }
  CHECK(weights == 9);  // tok, pos, q, k, v, out, fc, proj, head
}

TEST_CASE("a Transformer with frozen embeddings trains only its attention, MLPs and head") {
  nn::TransformerConfig c = small_config();
  c.mlp = true;
  c.frozen_embeddings = true;
  Generator gen(0);
  const nn::Transformer model(c, gen);
  for (const auto& [name, p] : model.named_parameters()) {
    INFO(name);
    const bool trains = name.find(".attn.") != std::string::npos || name.find(".fc.") != std::string::npos ||
                        name.find(".proj.") != std::string::npos || name.rfind("head.", 0) == 0;
    CHECK(p.requires_grad() == trains);
  }
  CHECK_THAT(invalid_argument_message([&] { model.forward(IndexArray{{0, 1, 5}}); }), Contains("5"));
  CHECK_THAT(invalid_argument_message([&] { model.forward(IndexArray{1, 2}); }), Contains("Transformer"));
}

TEST_CASE("a run folder saved through the library loads back: config, weights, optimizer state and metadata") {
  const std::string dir = scratch("transformer_run");
  nn::TransformerConfig c = small_config();
  c.mlp = true;
  Generator gen(3);
  nn::Transformer model(c, gen);
  optim::Adam adam(model.parameters(), {.lr = 1e-2});
  const IndexArray tokens{{0, 1, 2, 3}, {4, 3, 2, 1}}, targets{{1, 2, 0, -100}, {2, 2, 1, 0}};
  {
    nn::RunLock lock(dir);
    nn::save_config(dir, c);
    for (std::size_t step = 1; step <= 3; ++step) {
      adam.zero_grad();
      model.loss(model.forward(tokens), targets).backward();
      adam.step();
      nn::save_checkpoint(dir, model, adam.state_dict(), {.step = step, .metadata = {{"note", "step " + std::to_string(step)}}});
    }
  }
  const auto loaded = nn::load_transformer(dir);
  CHECK(nn::to_json(loaded->config()) == nn::to_json(c));
  check_close(loaded->forward(tokens).logits, model.forward(tokens).logits.to(DType::float64).value<double>(), 0);

  Generator other(99);
  nn::Transformer fresh(c, other);
  optim::Adam fresh_adam(fresh.parameters(), {.lr = 1e-2});
  const nn::Checkpoint checkpoint = nn::load_checkpoint(dir, fresh);
  CHECK(checkpoint.info.step == 3);
  CHECK(checkpoint.info.metadata == std::map<std::string, std::string>{{"note", "step 3"}});
  fresh_adam.load_state_dict(checkpoint.optimizer.tensors);
  // One more step from the loaded state equals one more step of the original.
  for (auto* m : {&model, &fresh}) {
    optim::Adam& a = m == &model ? adam : fresh_adam;
    a.zero_grad();
    m->loss(m->forward(tokens), targets).backward();
    a.step();
  }
  for (std::size_t i = 0; i < model.parameters().size(); ++i)
    CHECK(xt::all(xt::equal(model.parameters()[i].value<float>(), fresh.parameters()[i].value<float>())));

  // A config.json that does not fit the weights is named.
  nn::TransformerConfig wider = c;
  wider.d_model = 16;
  nn::save_config(dir, wider);
  CHECK_THAT(runtime_error_message([&] { nn::load_transformer(dir); }),
             Contains("model.safetensors: does not fit the model") && Contains("tok.weight (given (5,8), expected (5,16))"));
  // One whose weights would not fit in memory is refused before anything is allocated.
  wider.vocab_size = nn::TransformerConfig::max_width;
  wider.d_model = nn::TransformerConfig::max_width;
  nn::save_config(dir, wider);
  CHECK_THAT(runtime_error_message([&] { nn::load_transformer(dir); }), Contains("config.json: the model needs"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("load_transformer builds the model in the dtype its weights were saved in") {
  const std::string dir = scratch("transformer_f64");
  nn::TransformerConfig c = small_config();
  c.dtype = DType::float64;
  Generator gen(5);
  const nn::Transformer model(c, gen);
  nn::save_config(dir, c);
  nn::save_checkpoint(dir, model, {}, {.step = 1});
  const auto loaded = nn::load_transformer(dir);
  CHECK(loaded->config().dtype == DType::float64);
  CHECK(loaded->tok.weight.dtype() == DType::float64);
  const IndexArray tokens{{4, 0, 2}};
  check_close(loaded->forward(tokens).logits, model.forward(tokens).logits.value<double>(), 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a Transformer with sinusoidal positions adds the fixed table and has no pos.weight") {
  nn::TransformerConfig c = small_config();
  c.positions = nn::Positions::sinusoidal;
  c.dtype = DType::float64;
  Generator gen(0);
  const nn::Transformer model(c, gen);
  CHECK_FALSE(model.pos);
  for (const auto& [name, p] : model.named_parameters()) CHECK(name != "pos.weight");
  CHECK(nn::parameter_count(c) == double(numel(model)));
  CHECK(nn::parameter_count(small_config()) - nn::parameter_count(c) == 6 * 8);  // the learned table
  // Row t of the table: sin(t / 10000^(2i/D)) in column 2i, cos in 2i + 1 (D = 8).
  const Array<double> table = model.position_table().value<double>();
  CHECK(table(3, 2) == Approx(std::sin(3 / std::pow(10000.0, 2.0 / 8))).epsilon(1e-14));
  CHECK(table(5, 7) == Approx(std::cos(5 / std::pow(10000.0, 6.0 / 8))).epsilon(1e-14));
  // The config says so, and a config from before positions were recorded reads as learned.
  CHECK(nn::parse_transformer_config(nn::to_json(c), "f").positions == nn::Positions::sinusoidal);
  std::string old = nn::to_json(small_config());
  old.erase(old.find(",\"positions\":\"learned\""), std::string(",\"positions\":\"learned\"").size());
  CHECK(nn::parse_transformer_config(old, "f").positions == nn::Positions::learned);
}

TEST_CASE("a Transformer's mask per layer, and padding keys no query sees") {
  nn::TransformerConfig c = small_config();
  c.causal_layers = {true, false};
  c.dtype = DType::float64;
  Generator gen(6);
  const nn::Transformer model(c, gen);
  CHECK(model.causal(0));
  CHECK_FALSE(model.causal(1));
  CHECK(nn::parse_transformer_config(nn::to_json(c), "f").causal_layers == std::vector<bool>{true, false});
  const nn::TransformerOutput out = model.forward(IndexArray{{1, 2, 3, 4}}, true);
  const Array<double>& w0 = out.attention[0].weights.value<double>();
  const Array<double>& w1 = out.attention[1].weights.value<double>();
  CHECK(w0(0, 0, 0, 3) == 0);  // causal: query 0 sees key 0 only
  CHECK(w1(0, 0, 0, 3) > 0);   // bidirectional: it sees key 3 too
  // Padding: the last two positions are padding; what they hold changes no real position's logits.
  const MaskArray padding = {{true, true, false, false}};
  const Array<double> a = model.forward(IndexArray{{1, 2, 0, 0}}, false, padding).logits.value<double>();
  const Array<double> b = model.forward(IndexArray{{1, 2, 4, 3}}, false, padding).logits.value<double>();
  check_close(Array<double>(xt::view(a, 0, xt::range(0, 2))), xt::view(b, 0, xt::range(0, 2)), 0);
  const Array<double> unmasked = model.forward(IndexArray{{1, 2, 4, 3}}).logits.value<double>();
  CHECK(xt::amax(xt::abs(xt::view(unmasked - b, 0, xt::range(0, 2))))() > 1e-6);  // without it, they leak
  nn::TransformerConfig bad = c;
  bad.causal_layers = {true};
  CHECK_THROWS_WITH(nn::check(bad), "has 1 entries for 2 layers: give one mask per layer");
}
