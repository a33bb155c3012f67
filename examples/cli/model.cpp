#include "examples/cli/model.hpp"

#include <cmath>
#include <limits>

#include "qkv/core/ops.hpp"

namespace qkv::cli {

namespace {

nn::MultiHeadAttentionOptions attention_options(const ModelConfig& c) {
  nn::MultiHeadAttentionOptions o;
  o.d_model = c.d_model;
  o.n_heads = c.heads;
  o.n_kv_heads = c.kv_heads;
  o.d_head = c.d_head;
  o.qk = c.qk;
  o.proj = c.proj;
  if (!c.scale) o.scale = 1.0;
  return o;
}

}  // namespace

Block::Block(const ModelConfig& c, Generator& gen) : ln1(c.d_model), attn(attention_options(c), gen) {
  register_module("ln1", ln1);
  register_module("attn", attn);
  if (c.mlp) {
    ln2 = std::make_unique<nn::LayerNorm>(c.d_model);
    fc = std::make_unique<nn::Linear>(c.d_model, 4 * c.d_model, true, DType::float32, gen);
    proj = std::make_unique<nn::Linear>(4 * c.d_model, c.d_model, true, DType::float32, gen);
    register_module("ln2", *ln2);
    register_module("fc", *fc);
    register_module("proj", *proj);
  }
}

Model::Model(const ModelConfig& c, Generator& gen)
    : tok(c.vocab_size, c.d_model, DType::float32, gen), pos(c.max_len, c.d_model, DType::float32, gen), ln_f(c.d_model),
      config_(c) {
  if (c.layers == 0) fail("model", "--layers must be positive");
  register_module("tok", tok);
  register_module("pos", pos);
  for (std::size_t l = 0; l < c.layers; ++l) {
    blocks.push_back(std::make_unique<Block>(c, gen));
    register_module("layers." + std::to_string(l), *blocks.back());
  }
  register_module("ln_f", ln_f);
  if (c.readout == Readout::token) {
    head = std::make_unique<nn::Linear>(c.d_model, c.n_classes, true, DType::float32, gen);
    register_module("head", *head);
  }
  if (c.frozen_embeddings) {
    std::vector<nn::Module*> frozen{&tok, &pos, &ln_f};
    for (const auto& b : blocks) {
      frozen.push_back(&b->ln1);
      if (b->ln2) frozen.push_back(b->ln2.get());
    }
    for (nn::Module* m : frozen)
      for (Tensor& t : m->parameters()) t.requires_grad_(false);
  }
}

Forward Model::forward(const IndexArray& tokens, bool need_weights) const {
  Forward f;
  Tensor x = pos(tok(tokens));  // (B, T, D)
  const nn::AttentionMask mask{.causal = config_.causal};
  for (std::size_t l = 0; l < blocks.size(); ++l) {
    const Block& b = *blocks[l];
    const bool last = l + 1 == blocks.size();
    f.inputs.push_back(b.ln1(x));
    nn::AttentionResult r =
        b.attn.forward(f.inputs.back(), mask, need_weights || (last && config_.readout == Readout::pointer));
    x = x + r.output;
    if (b.fc) x = x + (*b.proj)(gelu((*b.fc)((*b.ln2)(x))));
    f.attention.push_back(std::move(r));
  }
  if (config_.readout == Readout::pointer) {
    const Tensor& s = f.attention.back().scores;  // (B, H, T, T)
    f.output = reshape(slice(s, 1, 0, 1), {std::int64_t(s.size(0)), std::int64_t(s.size(2)), std::int64_t(s.size(3))});
  } else {
    f.output = (*head)(ln_f(x));
  }
  return f;
}

Tensor Model::loss(const Forward& f, const IndexArray& targets) const {
  const std::int64_t classes = std::int64_t(f.output.size(-1));
  const IndexArray flat = xt::reshape_view(targets, Shape{targets.size()});
  return cross_entropy(reshape(f.output, {-1, classes}), flat, ignore_target);
}

IndexArray Model::predictions(const Tensor& output) {
  const auto argmax_rows = [](const auto& v) {
    const std::size_t B = v.shape()[0], T = v.shape()[1], C = v.shape()[2];
    IndexArray out = IndexArray::from_shape({B, T});
    for (std::size_t i = 0; i < B * T; ++i) {
      const auto* row = v.data() + i * C;
      out.data()[i] = std::int64_t(std::max_element(row, row + C) - row);
    }
    return out;
  };
  return output.dtype() == DType::float32 ? argmax_rows(output.value<float>()) : argmax_rows(output.value<double>());
}

}  // namespace qkv::cli
