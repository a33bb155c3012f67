#include "qkv/nn/gradcheck_cases.hpp"

#include <cmath>

#include "qkv/core/ops.hpp"
#include "qkv/nn/attention.hpp"
#include "qkv/nn/seq2seq.hpp"
#include "qkv/nn/transformer.hpp"

namespace qkv::nn {

namespace {

using Inputs = std::vector<Tensor>;

// A float64 leaf that requires grad, drawn from N(0, 1), or uniform in [low, high).
Tensor normal_input(const Shape& shape, Generator& gen) {
  Tensor t = randn(shape, DType::float64, gen);
  t.requires_grad_();
  return t;
}
Tensor uniform_input(const Shape& shape, double low, double high, Generator& gen) {
  Tensor t = uniform(shape, low, high, DType::float64, gen);
  t.requires_grad_();
  return t;
}
// Entries drawn away from a kink at 0 (relu), |x| ≥ 0.1.
Tensor away_from_zero_input(const Shape& shape, Generator& gen) {
  Tensor t = randn(shape, DType::float64, gen);
  for (double& v : t.mutable_value<double>()) v = std::copysign(0.1 + std::abs(v), v);
  t.requires_grad_();
  return t;
}

struct Catalogue {
  std::vector<GradcheckCase> cases;
  std::uint64_t seed = 1;

  // setup(gen) -> {inputs, f}, from a generator seeded per case. A module's f owns the module,
  // and its parameters are among the inputs.
  template <class Setup>
  void add_setup(std::string op, std::string name, Setup setup, GradcheckOptions options = {}) {
    cases.push_back({std::move(op), std::move(name), [s = seed++, setup, options] {
      Generator gen(s);
      auto [inputs, f] = setup(gen);
      return gradcheck(f, inputs, options);
    }});
  }

  // f over inputs made by `make`.
  template <class Make>
  void add(std::string op, std::string name, Make make, GradcheckFunction f, GradcheckOptions options = {}) {
    add_setup(std::move(op), std::move(name), [make, f](Generator& gen) { return std::pair(make(gen), f); }, options);
  }
};

// The inputs followed by every parameter of the module.
Inputs with_parameters(Inputs inputs, const nn::Module& m) {
  for (const Tensor& p : m.parameters()) inputs.push_back(p);
  return inputs;
}

// Every module, with respect to its inputs and every parameter.
void add_module_cases(Catalogue& c) {
  using namespace nn;
  const auto f64 = DType::float64;
  c.add_setup("Linear", "Linear 4->3", [=](Generator& g) {
    auto m = std::make_shared<Linear>(4, 3, true, f64, g);
    return std::pair(with_parameters({normal_input({2, 5, 4}, g)}, *m), GradcheckFunction([m](const Inputs& x) { return (*m)(x[0]); }));
  });
  c.add_setup("Linear", "Linear 4->3 no bias", [=](Generator& g) {
    auto m = std::make_shared<Linear>(4, 3, false, f64, g);
    return std::pair(with_parameters({normal_input({5, 4}, g)}, *m), GradcheckFunction([m](const Inputs& x) { return (*m)(x[0]); }));
  });
  c.add_setup("Embedding", "Embedding 6x3", [=](Generator& g) {
    auto m = std::make_shared<Embedding>(6, 3, f64, g);
    return std::pair(with_parameters({}, *m), GradcheckFunction([m](const Inputs&) { return (*m)(IndexArray{{5, 0, 5}, {2, 2, 1}}); }));
  });
  c.add_setup("LayerNorm", "LayerNorm 5 (perturbed affine)", [=](Generator& g) {
    auto m = std::make_shared<LayerNorm>(5, 1e-5, true, f64);
    m->weight.copy_(randn({5}, f64, g));
    m->bias.copy_(randn({5}, f64, g));
    return std::pair(with_parameters({normal_input({2, 3, 5}, g)}, *m), GradcheckFunction([m](const Inputs& x) { return (*m)(x[0]); }));
  });
  c.add_setup("LearnedPositionalEncoding", "LearnedPositionalEncoding max_len 6, offset 2", [=](Generator& g) {
    auto m = std::make_shared<LearnedPositionalEncoding>(6, 3, f64, g);
    return std::pair(with_parameters({normal_input({2, 4, 3}, g)}, *m), GradcheckFunction([m](const Inputs& x) { return (*m)(x[0], 2); }));
  });
  c.add_setup("SinusoidalPositionalEncoding", "SinusoidalPositionalEncoding max_len 8", [=](Generator& g) {
    auto m = std::make_shared<SinusoidalPositionalEncoding>(8, 4);
    return std::pair(Inputs{normal_input({2, 5, 4}, g)}, GradcheckFunction([m](const Inputs& x) { return (*m)(x[0], 1); }));
  });

  // MultiHeadAttention: each option alone and in combination. B = 2, Tq = 4, d_model = 8.
  struct Config {
    std::string name;
    MultiHeadAttentionOptions options;
    AttentionMask mask;
    bool cross = false;  // query, key and value from separate inputs, Tk = 3
    bool weights = false;  // need_weights: the unfused path, op by op
  };
  MaskArray padding = {{true, true, true, false}, {true, false, false, false}};  // (B, Tk)
  MaskArray cross_padding = {{true, true, false}, {false, true, true}};
  MaskArray band = xt::ones<bool>(Shape{4, 4});  // an arbitrary (Tq, Tk) mask: no look 2+ back
  for (std::size_t i = 0; i < 4; ++i)
    for (std::size_t j = 0; j + 2 <= i; ++j) band(i, j) = false;
  const auto opts = [](std::size_t heads, auto edit) {
    MultiHeadAttentionOptions o;
    o.d_model = 8;
    o.n_heads = heads;
    o.dtype = DType::float64;
    edit(o);
    return o;
  };
  const auto same = [](MultiHeadAttentionOptions&) {};
  std::vector<Config> configs = {
      {"default", opts(2, same), {}},
      {"causal", opts(2, same), {.causal = true}},
      {"causal+padding", opts(2, same), {.causal = true, .key_padding = padding}},
      {"mask", opts(2, same), {.allowed = band}},
      {"causal+padding+mask", opts(2, same), {.causal = true, .key_padding = padding, .allowed = band}},
      {"cross kdim=5 vdim=6", opts(2, [](auto& o) { o.kdim = 5; o.vdim = 6; }), {}, true},
      {"cross+GQA", opts(4, [](auto& o) { o.n_kv_heads = 2; o.kdim = 5; o.vdim = 6; }), {.key_padding = cross_padding}, true},
      {"GQA+causal", opts(4, [](auto& o) { o.n_kv_heads = 2; }), {.causal = true}},
      {"MQA", opts(4, [](auto& o) { o.n_kv_heads = 1; }), {.causal = true}},
      {"tied", opts(2, [](auto& o) { o.qk = QK::tied; }), {}},
      {"tied+causal", opts(2, [](auto& o) { o.qk = QK::tied; }), {.causal = true}},
      {"symmetric", opts(2, [](auto& o) { o.qk = QK::symmetric; }), {}},
      {"symmetric+causal+padding", opts(2, [](auto& o) { o.qk = QK::symmetric; }), {.causal = true, .key_padding = padding}},
      {"symmetric, d_head=3, need_weights", opts(2, [](auto& o) { o.qk = QK::symmetric; o.d_head = 3; }),
       {.causal = true}, false, true},
      {"symmetric+identity", opts(2, [](auto& o) { o.qk = QK::symmetric; o.proj = Projection::identity; }), {}},
      {"cross+symmetric", opts(2, [](auto& o) { o.qk = QK::symmetric; o.vdim = 6; }), {.key_padding = cross_padding}, true},
      {"no bias", opts(2, [](auto& o) { o.qkv_bias = false; o.out_bias = false; }), {.causal = true}},
      {"qkv bias only", opts(2, [](auto& o) { o.out_bias = false; }), {}},
      {"d_v=3 != d_head=4", opts(2, [](auto& o) { o.d_v = 3; }), {.causal = true}},
      {"d_head=3 (d_model 8, 2 heads)", opts(2, [](auto& o) { o.d_head = 3; }), {}},
      {"scale=0.7", opts(2, [](auto& o) { o.scale = 0.7; }), {.causal = true}},
      {"identity", opts(2, [](auto& o) { o.proj = Projection::identity; }), {.causal = true}},
      {"frozen", opts(2, [](auto& o) { o.proj = Projection::frozen; }), {.causal = true}},
      {"identity-qk", opts(2, [](auto& o) { o.proj = Projection::identity_qk; }), {.causal = true}},
      {"identity-qk, symmetric, cross vdim=6, need_weights",
       opts(2, [](auto& o) { o.proj = Projection::identity_qk; o.qk = QK::symmetric; o.vdim = 6; }),
       {.key_padding = cross_padding}, true, true},
      {"causal, need_weights", opts(2, same), {.causal = true}, false, true},
      {"cross+GQA+padding, need_weights", opts(4, [](auto& o) { o.n_kv_heads = 2; o.kdim = 5; o.vdim = 6; }),
       {.key_padding = cross_padding}, true, true},
  };
  for (const Config& cfg : configs) {
    c.add_setup("MultiHeadAttention", "MultiHeadAttention " + cfg.name, [cfg](Generator& g) {
      auto m = std::make_shared<MultiHeadAttention>(cfg.options, g);
      const auto& o = m->options();
      if (!cfg.cross) {
        return std::pair(with_parameters({normal_input({2, 4, 8}, g)}, *m), GradcheckFunction([m, cfg](const Inputs& x) {
          return m->forward(x[0], cfg.mask, cfg.weights).output;
        }));
      }
      Inputs in{normal_input({2, 4, 8}, g), normal_input({2, 3, o.kdim}, g), normal_input({2, 3, o.vdim}, g)};
      return std::pair(with_parameters(in, *m), GradcheckFunction([m, cfg](const Inputs& x) {
        return m->forward(x[0], x[1], x[2], cfg.mask, cfg.weights).output;
      }));
    });
  }
}

// The whole Transformer, with respect to every parameter, through its loss: each readout, with
// and without the MLP, tied, GQA and frozen embeddings, and with hooks installed.
void add_transformer_cases(Catalogue& c) {
  using namespace nn;
  const auto config = [](auto edit) {
    TransformerConfig t{.vocab_size = 5, .n_classes = 3, .max_len = 5, .layers = 2, .d_model = 8, .heads = 2,
                        .dtype = DType::float64};
    edit(t);
    return t;
  };
  const std::vector<std::pair<std::string, TransformerConfig>> configs = {
      {"token, causal", config([](auto&) {})},
      {"token, causal, MLP", config([](auto& t) { t.mlp = true; })},
      {"token, bidirectional, MLP, GQA", config([](auto& t) { t.mlp = true; t.causal = false; t.heads = 4; t.kv_heads = 2; })},
      {"pointer, tied", config([](auto& t) { t.readout = Readout::pointer; t.n_classes = 0; t.qk = QK::tied; })},
      {"token, bidirectional, symmetric, MLP", config([](auto& t) { t.causal = false; t.qk = QK::symmetric; t.mlp = true; })},
      {"token, sinusoidal positions", config([](auto& t) { t.positions = Positions::sinusoidal; })},
      {"token, frozen embeddings, MLP", config([](auto& t) { t.mlp = true; t.frozen_embeddings = true; })},
      {"token, ReLU MLP of 12, no LayerNorm, no attention biases, normal init", config([](auto& t) {
         t.mlp = true;
         t.d_mlp = 12;
         t.activation = Activation::relu;
         t.layer_norm = false;
         t.attention_bias = false;
         t.init = Init::normal;
       })},
  };
  for (const auto& named : configs) {
    const TransformerConfig cfg = named.second;  // a copy the lambda keeps (Clang captures no structured binding)
    c.add_setup("Transformer", "Transformer " + named.first, [cfg](Generator& g) {
      auto m = std::make_shared<Transformer>(cfg, g);
      const IndexArray tokens{{0, 3, 1, 4, 2}, {4, 4, 0, 1, 3}};
      const IndexArray targets = cfg.readout == Readout::pointer ? IndexArray{{-100, 0, 1, 2, 3}, {-100, 1, -100, 0, 2}}
                                                                 : IndexArray{{1, -100, 2, 0, 2}, {0, 2, 1, -100, 1}};
      Inputs params;
      for (const Tensor& p : m->parameters())
        if (p.requires_grad()) params.push_back(p);
      return std::pair(params, GradcheckFunction([m, tokens, targets](const Inputs&) {
                         return m->loss(m->forward(tokens), targets);
                       }));
    });
  }
  // forward_last, as a loss scored at the last position alone runs it (modadd's model, smaller).
  c.add_setup("Transformer", "Transformer forward_last, ReLU MLP, no LayerNorm", [config](Generator& g) {
    auto m = std::make_shared<Transformer>(config([](auto& t) {
      t.mlp = true;
      t.activation = Activation::relu;
      t.layer_norm = false;
      t.attention_bias = false;
    }), g);
    const IndexArray tokens{{0, 3, 1, 4, 2}, {4, 4, 0, 1, 3}, {1, 2, 3, 0, 0}};
    IndexArray targets = IndexArray::from_shape({3, 1});  // at the last position
    targets(0, 0) = 1, targets(1, 0) = 2, targets(2, 0) = 0;
    Inputs params;
    for (const Tensor& p : m->parameters())
      if (p.requires_grad()) params.push_back(p);
    return std::pair(params, GradcheckFunction([m, tokens, targets](const Inputs&) {
                       return m->loss(m->forward_last(tokens), targets);
                     }));
  });
  // forward_last on more sequences (7) than tokens (5), as modadd's batch: layer 0's LayerNorm and
  // projections run on the (token, position) table and are gathered, with tied q and k.
  c.add_setup("Transformer", "Transformer forward_last gathered, LayerNorm, tied", [config](Generator& g) {
    auto m = std::make_shared<Transformer>(config([](auto& t) {
      t.mlp = true;
      t.qk = QK::tied;
    }), g);
    const IndexArray tokens{{0, 3, 1, 4, 2}, {4, 4, 0, 1, 3}, {1, 2, 3, 0, 0}, {2, 2, 2, 2, 2},
                            {3, 0, 4, 1, 1}, {0, 0, 1, 4, 3}, {4, 3, 2, 1, 0}};
    IndexArray targets = IndexArray::from_shape({7, 1});
    for (std::size_t b = 0; b < 7; ++b) targets(b, 0) = std::int64_t(b % 3);
    Inputs params;
    for (const Tensor& p : m->parameters())
      if (p.requires_grad()) params.push_back(p);
    return std::pair(params, GradcheckFunction([m, tokens, targets](const Inputs&) {
                       return m->loss(m->forward_last(tokens), targets);
                     }));
  });
  // With a hook on every point of a GQA model: each scales its activation by 0.9, and layer 1's
  // hook_z scales head 1 by 0.5, so every gradient flows through what the hooks return.
  c.add_setup("Transformer", "Transformer token, MLP, GQA, hooks everywhere", [config](Generator& g) {
    auto m = std::make_shared<Transformer>(config([](auto& t) {
      t.mlp = true;
      t.causal = false;
      t.heads = 4;
      t.kv_heads = 2;
    }), g);
    for (const std::string& name : m->hook_names())
      m->add_hook(name, [](const Tensor& v, const std::string& point) {
        if (point == "blocks.1.attn.hook_z") {  // (B, T, H, d_v)
          const Tensor scale(Array<double>(xt::xarray<double>{1, 1, 0.5, 0.5, 1, 1, 1, 1}));
          return v * reshape(scale, {1, 1, 4, 2});
        }
        return v * 0.9;
      });
    const IndexArray tokens{{0, 3, 1, 4, 2}, {4, 4, 0, 1, 3}};
    const IndexArray targets{{1, -100, 2, 0, 2}, {0, 2, 1, -100, 1}};
    Inputs params;
    for (const Tensor& p : m->parameters())
      if (p.requires_grad()) params.push_back(p);
    return std::pair(params, GradcheckFunction([m, tokens, targets](const Inputs&) {
                       return m->loss(m->forward(tokens), targets);
                     }));
  });
}

// The encoder–decoder, with respect to every parameter, through its loss: with and without the
// MLP and source padding, tied projections (one matrix reading the decoder's stream for queries
// and the encoder's for keys in cross-attention), and a hook on every point.
void add_encoder_decoder_cases(Catalogue& c) {
  using namespace nn;
  const auto config = [](auto edit) {
    EncoderDecoderConfig t{.src_vocab = 5, .tgt_vocab = 4, .max_src_len = 5, .max_tgt_len = 4, .encoder_layers = 2,
                           .decoder_layers = 2, .d_model = 8, .heads = 2, .dtype = DType::float64};
    edit(t);
    return t;
  };
  const std::vector<std::tuple<std::string, EncoderDecoderConfig, bool, bool>> configs = {
      {"EncoderDecoder", config([](auto&) {}), false, false},
      {"EncoderDecoder MLP, source padding", config([](auto& t) { t.mlp = true; }), true, false},
      {"EncoderDecoder tied, sinusoidal positions", config([](auto& t) { t.qk = QK::tied; t.positions = Positions::sinusoidal; }),
       false, false},
      {"EncoderDecoder MLP, hooks everywhere", config([](auto& t) { t.mlp = true; }), true, true},
  };
  for (const auto& [name, cfg_, padded_, hooked_] : configs) {
    const EncoderDecoderConfig cfg = cfg_;  // copies the lambda keeps (Clang captures no structured binding)
    const bool padded = padded_, hooked = hooked_;
    c.add_setup("EncoderDecoder", name, [cfg, padded, hooked](Generator& g) {
      auto m = std::make_shared<EncoderDecoder>(cfg, g);
      if (hooked)
        for (const std::string& point : m->hook_names())
          m->add_hook(point, [](const Tensor& v, const std::string&) { return v * 0.9; });
      const IndexArray source{{0, 3, 1, 4, 2}, {4, 4, 0, 1, 3}}, input{{0, 2, 1, 3}, {0, 1, 1, 2}};
      const IndexArray targets{{2, 1, 3, -100}, {1, -100, 2, 0}};
      MaskArray padding;
      if (padded) padding = MaskArray{{true, true, true, true, true}, {true, true, true, false, false}};
      Inputs params;
      for (const Tensor& p : m->parameters())
        if (p.requires_grad()) params.push_back(p);
      return std::pair(params, GradcheckFunction([m, source, input, targets, padding](const Inputs&) {
                         return m->loss(m->forward(source, input, false, padding), targets);
                       }));
    });
  }
}

std::vector<GradcheckCase> build() {
  Catalogue c;
  const auto two = [](Shape a, Shape b) {
    return [a, b](Generator& g) { return Inputs{normal_input(a, g), normal_input(b, g)}; };
  };
  const auto one = [](Shape a) { return [a](Generator& g) { return Inputs{normal_input(a, g)}; }; };

  // Broadcasting arithmetic.
  c.add("add", "add (2,3,4)+(4)", two({2, 3, 4}, {4}), [](const Inputs& x) { return x[0] + x[1]; });
  c.add("add", "add (3,1)+(1,4)", two({3, 1}, {1, 4}), [](const Inputs& x) { return x[0] + x[1]; });
  c.add("sub", "sub (2,3)-(3)", two({2, 3}, {3}), [](const Inputs& x) { return x[0] - x[1]; });
  c.add("sub", "sub (3,1)-(1,4)", two({3, 1}, {1, 4}), [](const Inputs& x) { return x[0] - x[1]; });
  c.add("mul", "mul (3,1)*(1,4)", two({3, 1}, {1, 4}), [](const Inputs& x) { return x[0] * x[1]; });
  c.add("mul", "mul (2,3,4)*(4)", two({2, 3, 4}, {4}), [](const Inputs& x) { return x[0] * x[1]; });
  c.add("div", "div (2,3)/(2,1)", [](Generator& g) {
    return Inputs{normal_input({2, 3}, g), uniform_input({2, 1}, 0.5, 2.0, g)};
  }, [](const Inputs& x) { return x[0] / x[1]; });
  c.add("neg", "neg (2,3)", one({2, 3}), [](const Inputs& x) { return -x[0]; });

  // matmul.
  c.add("matmul", "matmul (3,4)@(4,5)", two({3, 4}, {4, 5}), [](const Inputs& x) { return matmul(x[0], x[1]); });
  c.add("matmul", "matmul (2,3,4)@(4,5)", two({2, 3, 4}, {4, 5}), [](const Inputs& x) { return matmul(x[0], x[1]); });
  c.add("matmul", "matmul (2,3,4)@(2,4,5)", two({2, 3, 4}, {2, 4, 5}), [](const Inputs& x) { return matmul(x[0], x[1]); });
  c.add("matmul", "matmul (2,1,3,4)@(3,4,2) broadcast batch", two({2, 1, 3, 4}, {3, 4, 2}),
        [](const Inputs& x) { return matmul(x[0], x[1]); });
  c.add("matmul", "matmul (3,4)@(2,4,5) broadcast batch", two({3, 4}, {2, 4, 5}),
        [](const Inputs& x) { return matmul(x[0], x[1]); });
  c.add("matmul", "matmul (4)@(4,3) vector", two({4}, {4, 3}), [](const Inputs& x) { return matmul(x[0], x[1]); });
  c.add("matmul", "matmul (2,3,4)@(4) vector", two({2, 3, 4}, {4}), [](const Inputs& x) { return matmul(x[0], x[1]); });

  c.add("linear", "linear (2,3,4) by (5,4) + bias", [](Generator& g) {
    return Inputs{normal_input({2, 3, 4}, g), normal_input({5, 4}, g), normal_input({5}, g)};
  }, [](const Inputs& x) { return linear(x[0], x[1], x[2]); });
  c.add("linear", "linear (3,4) by (2,4) no bias", two({3, 4}, {2, 4}), [](const Inputs& x) { return linear(x[0], x[1], Tensor()); });

  // Moves of elements.
  c.add("reshape", "reshape (2,3,4)->(6,-1)", one({2, 3, 4}), [](const Inputs& x) { return reshape(x[0], {6, -1}); });
  c.add("permute", "permute (2,3,4) by (2,0,1)", one({2, 3, 4}), [](const Inputs& x) { return permute(x[0], {2, 0, 1}); });
  c.add("transpose", "transpose (2,3,4) axes 0,2", one({2, 3, 4}), [](const Inputs& x) { return transpose(x[0], 0, 2); });
  c.add("slice", "slice (3,5) axis 1 [1,4)", one({3, 5}), [](const Inputs& x) { return slice(x[0], 1, 1, 4); });
  c.add("slice", "slice (4,3) axis 0 [-2,4)", one({4, 3}), [](const Inputs& x) { return slice(x[0], 0, -2, 4); });
  c.add("concat", "concat (2,1),(2,3),(2,2) axis 1", [](Generator& g) {
    return Inputs{normal_input({2, 1}, g), normal_input({2, 3}, g), normal_input({2, 2}, g)};
  }, [](const Inputs& x) { return concat(x, 1); });
  c.add("split", "split (2,5) sizes (2,3) axis 1", one({2, 5}), [](const Inputs& x) {
    auto parts = split(x[0], std::vector<std::size_t>{2, 3}, 1);
    return matmul(transpose(parts[0], 0, 1), parts[1]);  // (2,2)ᵀ @ (2,3): both pieces, differently
  });
  c.add("split", "split (5,2) size 2 axis 0", one({5, 2}), [](const Inputs& x) {
    auto parts = split(x[0], std::size_t(2), 0);
    return parts[0] * parts[1] + sum(parts[2]);
  });

  // Reductions over each axis, with and without keepdim, and over all.
  for (const char* op : {"sum", "mean", "max"}) {
    const auto reduce = [op = std::string(op)](const Tensor& x, std::vector<std::int64_t> axes, bool keepdim) {
      return op == "sum" ? sum(x, axes, keepdim) : op == "mean" ? mean(x, axes, keepdim) : max(x, axes, keepdim);
    };
    for (std::int64_t axis : {0, 1, 2})
      for (bool keepdim : {false, true})
        c.add(op, fmt::format("{} (2,3,4) axis {}{}", op, axis, keepdim ? " keepdim" : ""), one({2, 3, 4}),
              [reduce, axis, keepdim](const Inputs& x) { return reduce(x[0], {axis}, keepdim); });
    c.add(op, fmt::format("{} (2,3,4) axes (0,2)", op), one({2, 3, 4}),
          [reduce](const Inputs& x) { return reduce(x[0], {0, 2}, false); });
    c.add(op, fmt::format("{} (2,3,4) all", op), one({2, 3, 4}), [reduce](const Inputs& x) { return reduce(x[0], {}, false); });
  }

  // Pointwise functions.
  c.add("exp", "exp (2,3)", one({2, 3}), [](const Inputs& x) { return exp(x[0]); });
  c.add("log", "log (2,3) in [0.5,2)", [](Generator& g) { return Inputs{uniform_input({2, 3}, 0.5, 2.0, g)}; },
        [](const Inputs& x) { return log(x[0]); });
  c.add("sqrt", "sqrt (2,3) in [0.5,2)", [](Generator& g) { return Inputs{uniform_input({2, 3}, 0.5, 2.0, g)}; },
        [](const Inputs& x) { return sqrt(x[0]); });
  c.add("pow", "pow (2,3) in [0.5,2) ^ 2.5", [](Generator& g) { return Inputs{uniform_input({2, 3}, 0.5, 2.0, g)}; },
        [](const Inputs& x) { return pow(x[0], 2.5); });
  c.add("pow", "pow (2,3) ^ 3", one({2, 3}), [](const Inputs& x) { return pow(x[0], 3.0); });
  c.add("tanh", "tanh (2,3)", one({2, 3}), [](const Inputs& x) { return tanh(x[0]); });
  c.add("relu", "relu (2,3) away from 0", [](Generator& g) { return Inputs{away_from_zero_input({2, 3}, g)}; },
        [](const Inputs& x) { return relu(x[0]); });
  c.add("gelu", "gelu (2,3) erf", one({2, 3}), [](const Inputs& x) { return gelu(x[0]); });
  c.add("gelu", "gelu (2,3) tanh approximation", one({2, 3}),
        [](const Inputs& x) { return gelu(x[0], GeluApproximation::tanh); });
  c.add("cast", "cast float64 -> float64 (2,3)", one({2, 3}), [](const Inputs& x) { return cast(x[0], DType::float64); });

  // Softmax family and masking.
  const MaskArray causal = {{false, true, true}, {false, false, true}, {false, false, false}};
  c.add("softmax", "softmax (2,3,4) axis -1", one({2, 3, 4}), [](const Inputs& x) { return softmax(x[0], -1); });
  c.add("softmax", "softmax (2,3,4) axis 1", one({2, 3, 4}), [](const Inputs& x) { return softmax(x[0], 1); });
  c.add("log_softmax", "log_softmax (2,3,4) axis -1", one({2, 3, 4}), [](const Inputs& x) { return log_softmax(x[0], -1); });
  c.add("log_softmax", "log_softmax (2,3,4) axis 0", one({2, 3, 4}), [](const Inputs& x) { return log_softmax(x[0], 0); });
  c.add("masked_fill", "masked_fill (2,3,3) causal mask, value 0.5", one({2, 3, 3}),
        [causal](const Inputs& x) { return masked_fill(x[0], causal, 0.5); });
  c.add("masked_fill", "softmax of masked_fill(-inf) (2,3,3) causal", one({2, 3, 3}), [causal](const Inputs& x) {
    return softmax(masked_fill(x[0], causal, -INFINITY), -1);
  });
  c.add("log_softmax", "log_softmax of masked_fill(-inf) (2,3,3) causal", one({2, 3, 3}), [causal](const Inputs& x) {
    return masked_fill(log_softmax(masked_fill(x[0], causal, -INFINITY), -1), causal, 0.0);  // -inf → 0
  });

  // Losses and lookups.
  c.add("cross_entropy", "cross_entropy (4,5)", one({4, 5}),
        [](const Inputs& x) { return cross_entropy(x[0], IndexArray{0, 3, 4, 1}); });
  c.add("cross_entropy", "cross_entropy (2,3,5) ignore_index -1", one({2, 3, 5}),
        [](const Inputs& x) { return cross_entropy(x[0], IndexArray{{2, -1, 0}, {4, 4, -1}}, -1); });
  c.add("embedding", "embedding (5,3) indices (2,3) with repeats", one({5, 3}),
        [](const Inputs& x) { return embedding(x[0], IndexArray{{1, 4, 1}, {0, 1, 2}}); });
  c.add("layer_norm", "layer_norm (2,3,4) weight and bias", [](Generator& g) {
    return Inputs{normal_input({2, 3, 4}, g), normal_input({4}, g), normal_input({4}, g)};
  }, [](const Inputs& x) { return layer_norm(x[0], x[1], x[2]); });
  c.add("layer_norm", "layer_norm (3,5) no affine", one({3, 5}),
        [](const Inputs& x) { return layer_norm(x[0], Tensor(), Tensor()); });
  c.add("dropout", "dropout (4,5) p=0.3 fixed seed", one({4, 5}), [](const Inputs& x) {
    Generator gen(7);  // the same mask on every call
    return dropout(x[0], 0.3, true, gen);
  });

  // Graphs: one tensor feeding two ops accumulates both contributions; a small attention.
  c.add("graph", "graph x*x + exp(x): one tensor feeds two ops", one({2, 3}),
        [](const Inputs& x) { return x[0] * x[0] + exp(x[0]); });
  c.add("graph", "graph softmax(q kᵀ/√d) v", [](Generator& g) {
    return Inputs{normal_input({2, 3, 4}, g), normal_input({2, 5, 4}, g), normal_input({2, 5, 2}, g)};
  }, [](const Inputs& x) { return matmul(softmax(matmul(x[0], transpose(x[1], 1, 2)) / 2.0, -1), x[2]); });

  // scaled_dot_product_attention: heads packed in the last dimension. B = 2.
  const auto sdpa = [](std::size_t Tq, std::size_t Tk, std::size_t H, std::size_t Hkv, std::size_t dh, std::size_t dv) {
    return [=](Generator& g) {
      return Inputs{normal_input({2, Tq, H * dh}, g), normal_input({2, Tk, Hkv * dh}, g), normal_input({2, Tk, Hkv * dv}, g)};
    };
  };
  c.add("scaled_dot_product_attention", "scaled_dot_product_attention 2 heads", sdpa(4, 5, 2, 2, 3, 2),
        [](const Inputs& x) { return scaled_dot_product_attention(x[0], x[1], x[2], 2, 2, 0.6, false); });
  c.add("scaled_dot_product_attention", "scaled_dot_product_attention causal, Tq 3 < Tk 5", sdpa(3, 5, 2, 2, 3, 2),
        [](const Inputs& x) { return scaled_dot_product_attention(x[0], x[1], x[2], 2, 2, 0.6, true); });
  // More queries than keys: queries 0 and 1 see none, query 2 sees key 0 alone.
  c.add("scaled_dot_product_attention", "scaled_dot_product_attention causal, Tq 5 > Tk 3", sdpa(5, 3, 2, 2, 3, 2),
        [](const Inputs& x) { return scaled_dot_product_attention(x[0], x[1], x[2], 2, 2, 0.6, true); });
  c.add("scaled_dot_product_attention", "scaled_dot_product_attention GQA 4 heads, 2 kv heads, causal",
        sdpa(4, 4, 4, 2, 3, 2), [](const Inputs& x) { return scaled_dot_product_attention(x[0], x[1], x[2], 4, 2, 0.6, true); });
  c.add("scaled_dot_product_attention", "scaled_dot_product_attention MQA, mask with a fully masked row",
        sdpa(3, 4, 3, 1, 2, 3), [](const Inputs& x) {
          MaskArray allowed = xt::ones<bool>(Shape{2, 3, 3, 4});
          for (std::size_t j = 0; j < 4; ++j) allowed(1, 2, 0, j) = false;  // batch 1, head 2, query 0 sees nothing
          allowed(0, 0, 1, 3) = allowed(0, 1, 2, 0) = false;
          return scaled_dot_product_attention(x[0], x[1], x[2], 3, 1, 0.6, false, allowed);
        });

  c.add("scaled_dot_product_attention", "scaled_dot_product_attention packed qkv, GQA, causal", one({2, 4, 4 * 3 + 2 * (3 + 2)}),
        [](const Inputs& x) { return scaled_dot_product_attention(x[0], 4, 2, 3, 2, 0.6, true); });
  // Past 64 keys, tiles of 64 × 64 with the online softmax, computed again in backward.
  c.add("scaled_dot_product_attention", "scaled_dot_product_attention in tiles, causal, Tq 70 < Tk 130",
        sdpa(70, 130, 2, 1, 1, 1), [](const Inputs& x) { return scaled_dot_product_attention(x[0], x[1], x[2], 2, 1, 0.6, true); });
  c.add("scaled_dot_product_attention", "scaled_dot_product_attention in tiles, causal, Tq 140 > Tk 70",
        sdpa(140, 70, 2, 1, 1, 1), [](const Inputs& x) { return scaled_dot_product_attention(x[0], x[1], x[2], 2, 1, 0.6, true); });
  c.add("scaled_dot_product_attention", "scaled_dot_product_attention in tiles, GQA, mask hiding a whole tile",
        sdpa(70, 70, 4, 2, 1, 1), [](const Inputs& x) {
          MaskArray allowed = xt::ones<bool>(Shape{2, 4, 70, 70});
          for (std::size_t j = 0; j < 64; ++j) allowed(0, 1, 3, j) = false;  // query 3 sees keys past the first tile only
          for (std::size_t j = 0; j < 70; ++j) allowed(1, 3, 69, j) = false;  // query 69 sees nothing
          return scaled_dot_product_attention(x[0], x[1], x[2], 4, 2, 0.6, false, allowed);
        });

  add_module_cases(c);
  add_transformer_cases(c);
  add_encoder_decoder_cases(c);
  return std::move(c.cases);
}

}  // namespace

const std::vector<GradcheckCase>& gradcheck_cases() {
  static const std::vector<GradcheckCase> cases = build();
  return cases;
}

}  // namespace qkv::nn
