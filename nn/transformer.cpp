#include "qkv/nn/transformer.hpp"

#include <algorithm>
#include <atomic>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <xtensor/xview.hpp>

#include "qkv/core/ops.hpp"
#include "qkv/nn/checkpoint.hpp"
#include "qkv/nn/detail/json.hpp"
#include "qkv/nn/detail/transformer_json.hpp"
#include "qkv/nn/files.hpp"
#include "qkv/nn/safetensors.hpp"

namespace qkv::nn {

namespace {

template <class... Args>
[[noreturn]] void config_error(std::string field, fmt::format_string<Args...> text, Args&&... args) {
  throw ConfigError(std::move(field), fmt::format(text, std::forward<Args>(args)...));
}


const TransformerConfig& checked(const TransformerConfig& c) {
  check(c);
  return c;
}

}  // namespace

ConfigError::ConfigError(std::string field_, const std::string& message)
    : std::invalid_argument(message), field(std::move(field_)) {}

const char* name_of(Readout r) { return r == Readout::pointer ? "pointer" : "token"; }
const char* name_of(QK qk) { return qk == QK::tied ? "tied" : qk == QK::symmetric ? "symmetric" : "untied"; }
const char* name_of(Positions p) { return p == Positions::learned ? "learned" : "sinusoidal"; }
const char* name_of(Activation a) { return a == Activation::relu ? "relu" : "gelu"; }
const char* name_of(Init i) { return i == Init::normal ? "normal" : "uniform"; }
const char* name_of(Projection p) {
  return p == Projection::learned ? "learned" : p == Projection::frozen ? "frozen" : p == Projection::identity ? "identity"
                                                                                                             : "identity-qk";
}

void check(const TransformerConfig& c) {
  if (c.vocab_size == 0) config_error("vocab_size", "is 0: the model needs at least one token");
  if (c.max_len == 0) config_error("max_len", "is 0: the model needs at least one position");
  if (c.readout == Readout::token && c.n_classes == 0) config_error("n_classes", "is 0: the token readout needs classes");
  if (c.readout == Readout::pointer && c.n_classes != 0)
    config_error("n_classes", "is {}: the pointer readout points at positions and has no classes", c.n_classes);
  if (c.layers == 0) config_error("layers", "is 0: the model needs at least one layer");
  if (!c.causal_layers.empty() && c.causal_layers.size() != c.layers)
    config_error("causal_layers", "has {} entries for {} layers: give one mask per layer", c.causal_layers.size(), c.layers);
  if (c.d_model == 0) config_error("d_model", "is 0");
  if (!c.mlp && c.d_mlp != 0) config_error("d_mlp", "is {}, but the model has no MLP (mlp is false)", c.d_mlp);
  if (!c.mlp && c.activation != Activation::gelu)
    config_error("activation", "is {}, but the model has no MLP (mlp is false)", name_of(c.activation));
  if (c.heads == 0) config_error("heads", "is 0");
  if (c.kv_heads > c.heads) config_error("kv_heads", "is {}, more than heads ({})", c.kv_heads, c.heads);
  if (c.d_head == 0 && c.d_model % c.heads != 0)
    config_error("heads", "{} does not divide d_model {} (or give d_head)", c.heads, c.d_model);
  if (c.kv_heads != 0 && c.heads % c.kv_heads != 0)
    config_error("kv_heads", "{} does not divide heads {}", c.kv_heads, c.heads);
  const bool shared_kv = c.kv_heads != 0 && c.kv_heads != c.heads;
  if (c.qk == QK::symmetric && head_dim(c) < 2)
    config_error("d_head", "is {}: symmetric q and k need d_head of at least 2 (one +1 and one −1 sign)", head_dim(c));
  if (c.qk != QK::untied && shared_kv)
    config_error("kv_heads", "is {}: {} q and k need as many kv heads as heads ({})", c.kv_heads, name_of(c.qk), c.heads);
  const bool fixed_qk = c.proj == Projection::identity || c.proj == Projection::identity_qk;
  if (fixed_qk && shared_kv)
    config_error("kv_heads", "is {}: identity projections need as many kv heads as heads ({})", c.kv_heads, c.heads);
  if (fixed_qk && c.d_head != 0 && c.d_head * c.heads != c.d_model)
    config_error("d_head", "is {}: identity projections need d_head · heads = d_model ({} · {} ≠ {})", c.d_head,
                 c.d_head, c.heads, c.d_model);
}

std::size_t head_dim(const TransformerConfig& c) { return c.d_head ? c.d_head : c.d_model / c.heads; }

bool symmetric_scores(const TransformerConfig& c) {
  return c.qk != QK::untied || c.proj == Projection::identity || c.proj == Projection::identity_qk;
}

double parameter_count(const TransformerConfig& c) {
  const double D = double(c.d_model), H = double(c.heads), Hkv = double(c.kv_heads ? c.kv_heads : c.heads);
  const double dh = double(head_dim(c));
  // q, k and v: each a (heads · d_head, D) weight and its bias; tied k is q; identity has none.
  const double qkv_heads = c.proj == Projection::identity      ? 0
                           : c.proj == Projection::identity_qk ? Hkv
                           : c.qk != QK::untied                ? H + Hkv
                                                               : H + 2 * Hkv;
  const double bias = c.attention_bias ? 1 : 0, norm = c.layer_norm ? 2 * D : 0;
  const double attention = qkv_heads * dh * (D + bias) + H * dh * D + bias * D;
  const double hidden = double(c.d_mlp ? c.d_mlp : 4 * c.d_model);
  const double mlp = c.mlp ? norm + hidden * (D + 1) + D * (hidden + 1) : 0;
  const double head = c.readout == Readout::token ? double(c.n_classes) * (D + 1) : 0;
  const double positions = c.positions == Positions::learned ? double(c.max_len) * D : 0;
  return double(c.vocab_size) * D + positions + double(c.layers) * (norm + attention + mlp) + norm + head;
}

nlohmann::json detail::transformer_config_json(const TransformerConfig& c) {
  nlohmann::json j = config_json(c);
  j["embeddings"] = c.frozen_embeddings ? "frozen" : "learned";
  j["causal_layers"] = c.causal_layers;
  return j;
}

std::string to_json(const TransformerConfig& c) { return detail::transformer_config_json(c).dump(); }

TransformerConfig parse_transformer_config(std::string_view json, const std::string& file, const std::string& prefix) {
  return detail::read_transformer_config(detail::parse_json(json, file, 2), file, prefix);  // {"causal_layers": [...]}
}

TransformerConfig detail::read_transformer_config(const nlohmann::json& j, const std::string& file,
                                                  const std::string& prefix) {
  const detail::FieldReader m(j, file, prefix);
  if (m.has("encoder_layers"))
    m.fail_at("encoder_layers", "belongs to an encoder-decoder's config: load_encoder_decoder reads it");
  TransformerConfig c;
  FieldLoader loader{m};
  config_fields(c, loader);
  c.frozen_embeddings = m.choice("embeddings", {"learned", "frozen"}) == "frozen";
  if (m.has("causal_layers")) {
    const nlohmann::json& v = m.at("causal_layers");
    if (!v.is_array() || v.size() > TransformerConfig::max_layers ||
        !std::all_of(v.begin(), v.end(), [](const nlohmann::json& b) { return b.is_boolean(); }))
      m.fail_at("causal_layers", "must be a list of true or false, one per layer");
    for (const auto& b : v) c.causal_layers.push_back(b.get<bool>());
  }
  m.only(transformer_config_json(c));
  try {
    check(c);
  } catch (const ConfigError& e) {
    m.fail_at(e.field, "{}", e.what());
  }
  return c;
}

MLP::MLP(std::size_t d_model, DType dtype, Generator& gen, std::size_t d_hidden, Activation activation_)
    : fc(d_model, d_hidden ? d_hidden : 4 * d_model, true, dtype, gen),
      proj(d_hidden ? d_hidden : 4 * d_model, d_model, true, dtype, gen),
      activation(activation_) {
  register_module("fc", fc);
  register_hook("hook_pre", hook_pre);
  register_hook("hook_post", hook_post);
  register_module("proj", proj);
}

Tensor MLP::forward(const Tensor& x) const {
  const Tensor pre = hook_pre(fc(x));
  return proj(hook_post(activation == Activation::relu ? relu(pre) : gelu(pre)));
}

ResidualBlock::ResidualBlock(const BlockShape& shape) : shape_(shape) {
  if (shape.layer_norm) ln1 = std::make_unique<LayerNorm>(shape.d_model, 1e-5, true, shape.dtype);
}

Tensor ResidualBlock::normalized_input(const Tensor& x) const { return ln1_normalized(ln1 ? (*ln1)(x) : x); }

void ResidualBlock::register_input() {
  register_hook("hook_resid_pre", hook_resid_pre);
  if (ln1) register_module("ln1", *ln1);
  register_hook("ln1.hook_normalized", ln1_normalized);
}

void ResidualBlock::register_output(Generator& gen) {
  const BlockShape& s = shape_;
  if (s.mlp) {
    if (s.layer_norm) ln2 = std::make_unique<LayerNorm>(s.d_model, 1e-5, true, s.dtype);
    mlp = std::make_unique<MLP>(s.d_model, s.dtype, gen, s.d_mlp, s.activation);
    register_hook("hook_resid_mid", hook_resid_mid);
    if (ln2) register_module("ln2", *ln2);
    register_hook("ln2.hook_normalized", ln2_normalized);
    register_module("mlp", *mlp);
    register_hook("hook_mlp_out", hook_mlp_out);
  }
  register_hook("hook_resid_post", hook_resid_post);
}

Tensor ResidualBlock::output(const Tensor& x_in) const {
  if (!mlp) return hook_resid_post(x_in);
  const Tensor x = hook_resid_mid(x_in);
  return hook_resid_post(x + hook_mlp_out((*mlp)(ln2_normalized(ln2 ? (*ln2)(x) : x))));
}

TransformerBlock::TransformerBlock(const TransformerConfig& c, Generator& gen)
    : ResidualBlock(detail::block_shape(c)), attn(detail::attention_options(c), gen) {
  register_input();
  register_module("attn", attn);
  register_hook("hook_attn_out", hook_attn_out);
  register_output(gen);
}

Tensor TransformerBlock::forward(const Tensor& x_in, const AttentionMask& mask, bool need_weights, AttentionResult* attention,
                                 Tensor* input, KVCache* cache) const {
  const Tensor x = hook_resid_pre(x_in);
  const Tensor normalized = normalized_input(x);
  AttentionResult r = attn.forward(normalized, mask, need_weights, cache);
  r.output = hook_attn_out(r.output);
  const Tensor out = output(x + r.output);
  if (attention) *attention = std::move(r);
  if (input) *input = normalized;
  return out;
}

Tensor TransformerBlock::forward_last(const Tensor& x_in, const AttentionMask& mask) const {
  const Tensor x = hook_resid_pre(x_in);
  const Tensor normalized = normalized_input(x);
  const std::int64_t T = std::int64_t(x.size(1));
  AttentionResult r = attn.forward(slice(normalized, 1, T - 1, T), normalized, normalized, mask, false);
  return output(slice(x, 1, T - 1, T) + hook_attn_out(r.output));
}

bool TransformerBlock::gathers() const {
  return hook_resid_pre.empty() && ln1_normalized.empty() && !attn.hooked() && attn.q_proj && attn.v_proj;
}

Tensor TransformerBlock::forward_gathered(const Tensor& table, const IndexArray& rows, const AttentionMask& mask,
                                          bool last_only, Tensor* input) const {
  if (!gathers()) fail("TransformerBlock", "forward_gathered: a hook before the attention's output, or identity q, k, v");
  const std::size_t T = rows.shape()[1];
  const IndexArray query_rows = last_only ? IndexArray(xt::view(rows, xt::all(), xt::range(T - 1, T))) : rows;
  const Tensor normalized = normalized_input(table);  // ln1 of each row, once
  const Tensor a = hook_attn_out(attn.forward_gathered(normalized, rows, query_rows, mask));
  if (input) *input = embedding(normalized, rows);
  return output(embedding(table, query_rows) + a);
}

namespace detail {

namespace {
std::atomic<std::uint64_t> gathered_count{0};
}  // namespace

std::uint64_t gathered_runs() { return gathered_count.load(); }

Tensor embed(const Embedding& tok, const Tensor& table, const HookPoint& embed, const HookPoint& pos_embed,
             const IndexArray& tokens, std::size_t offset) {
  const std::size_t T = tokens.shape()[1];
  Tensor positions = slice(table, 0, std::int64_t(offset), std::int64_t(offset + T));  // (T, D), added to every sequence
  if (!pos_embed.empty()) {  // a hook sees them per sequence, (B, T, D), as TransformerLens shows them
    const std::vector<Tensor> copies(tokens.shape()[0], reshape(positions, {1, std::int64_t(T), -1}));
    positions = concat(copies, 0);
  }
  const Tensor embedded = embed(tok(tokens));  // before pos_embed, in this order
  return embedded + pos_embed(positions);
}

MultiHeadAttentionOptions attention_options(const TransformerConfig& c) {
  MultiHeadAttentionOptions o;
  o.d_model = c.d_model;
  o.n_heads = c.heads;
  o.n_kv_heads = c.kv_heads;
  o.d_head = c.d_head;
  o.qk = c.qk;
  o.proj = c.proj;
  o.dtype = c.dtype;
  o.qkv_bias = o.out_bias = c.attention_bias;
  if (!c.scale) o.scale = 1.0;
  return o;
}

BlockShape block_shape(const TransformerConfig& c) {
  return {.d_model = c.d_model, .dtype = c.dtype, .mlp = c.mlp, .d_mlp = c.d_mlp, .activation = c.activation,
          .layer_norm = c.layer_norm};
}

}  // namespace detail

Transformer::Transformer(const TransformerConfig& c, Generator& gen)
    : tok(checked(c).vocab_size, c.d_model, c.dtype, gen),
      config_(c) {
  register_hook("hook_embed", hook_embed);
  register_hook("hook_pos_embed", hook_pos_embed);
  register_module("tok", tok);
  if (c.positions == Positions::learned) {
    pos = std::make_unique<LearnedPositionalEncoding>(c.max_len, c.d_model, c.dtype, gen);
    register_module("pos", *pos);
  } else {
    sinusoids = std::make_unique<SinusoidalPositionalEncoding>(c.max_len, c.d_model);
  }
  for (std::size_t l = 0; l < c.layers; ++l) {
    blocks.push_back(std::make_unique<TransformerBlock>(c, gen));
    register_module("blocks." + std::to_string(l), *blocks.back());
  }
  if (c.layer_norm) {
    ln_final = std::make_unique<LayerNorm>(c.d_model, 1e-5, true, c.dtype);
    register_module("ln_final", *ln_final);
  }
  if (c.readout == Readout::token) {  // the pointer readout reads the last attention's scores, not ln_final
    register_hook("ln_final.hook_normalized", ln_final_normalized);
    head = std::make_unique<Linear>(c.d_model, c.n_classes, true, c.dtype, gen);
    register_module("head", *head);
  }
  if (c.frozen_embeddings) {
    std::vector<Module*> frozen{&tok, ln_final.get(), pos.get()};
    for (const auto& b : blocks) frozen.insert(frozen.end(), {b->ln1.get(), b->ln2.get()});
    for (Module* m : frozen)
      if (m)
        for (Tensor& t : m->parameters()) t.requires_grad_(false);
  }
  if (c.init == Init::normal) {
    // As Nanda et al.'s model: randn / √d_model, the unembedding's randn / √n_classes, biases 0.
    for (auto& [name, t] : named_parameters()) {
      const std::string module = name.substr(0, name.rfind('.'));
      if (module.substr(module.rfind('.') + 1).starts_with("ln")) continue;  // LayerNorms keep 1 and 0
      const bool bias = name.ends_with(".bias");
      const double sd = name == "head.weight" ? 1 / std::sqrt(double(c.n_classes)) : 1 / std::sqrt(double(c.d_model));
      Tensor drawn = bias ? zeros(t.shape(), t.dtype()) : randn(t.shape(), t.dtype(), gen) * sd;
      t.copy_(drawn);
    }
  }
}

bool layer_is_causal(const TransformerConfig& c, std::size_t l) {
  return c.causal_layers.empty() ? c.causal : bool(c.causal_layers.at(l));
}

bool Transformer::causal(std::size_t l) const { return layer_is_causal(config_, l); }

TransformerOutput Transformer::forward_last(const IndexArray& tokens, const MaskArray& key_padding) const {
  if (config_.readout != Readout::token) fail("Transformer", "forward_last reads the token readout; the model's is pointer");
  if (tokens.dimension() != 2 || tokens.shape()[1] == 0)
    fail("Transformer", "forward_last: tokens of shape {}: expected (batch, positions ≥ 1)", to_string(to_shape(tokens.shape())));
  return run(tokens, false, key_padding, nullptr, true);
}

TransformerOutput Transformer::forward(const IndexArray& tokens, bool need_weights, const MaskArray& key_padding) const {
  return run(tokens, need_weights, key_padding, nullptr);
}

void Transformer::check_decodable() const {
  for (std::size_t l = 0; l < blocks.size(); ++l)
    if (!causal(l)) fail("Transformer", "layer {} is bidirectional: only a causal model decodes one position at a time", l);
  if (config_.readout != Readout::token) fail("Transformer", "the pointer readout has no tokens to decode");
}

TransformerOutput Transformer::forward_cached(const IndexArray& tokens, std::vector<KVCache>& cache) const {
  check_decodable();
  if (cache.empty()) cache.resize(blocks.size());
  if (cache.size() != blocks.size()) fail("Transformer", "a KV cache of {} layers for {} layers", cache.size(), blocks.size());
  const std::vector<KVCache> before = cache;  // handles: what a failed step restores
  try {
    return run(tokens, false, MaskArray(), &cache);
  } catch (...) {
    cache = before;
    throw;
  }
}

TransformerOutput Transformer::run(const IndexArray& tokens, bool need_weights, const MaskArray& key_padding,
                                   std::vector<KVCache>* cache, bool last_only) const {
  if (tokens.dimension() != 2)
    fail("Transformer", "tokens of shape {}: expected (batch, positions)", to_string(to_shape(tokens.shape())));
  const std::size_t offset = cache ? (*cache)[0].length() : 0, T = tokens.shape()[1];
  if (offset + T > config_.max_len)
    fail("Transformer", "positions {} to {} are beyond max_len {}", offset, offset + T, config_.max_len);
  TransformerOutput f;
  const bool pointer = config_.readout == Readout::pointer;
  AttentionMask mask{.key_padding = key_padding};  // one copy of the padding for every layer
  // Scored at the last position, layer 0 projects each (token, position) pair once rather than
  // each of the B · T positions, when there are fewer pairs (modadd's 3 · 114 for 3,830 · 3).
  const std::size_t V = config_.vocab_size, D = config_.d_model, B = tokens.shape()[0];
  const bool gathered = last_only && V < B && hook_embed.empty() && hook_pos_embed.empty() && blocks[0]->gathers() &&
                        std::all_of(tokens.begin(), tokens.end(), [V](std::int64_t t) { return t >= 0 && t < std::int64_t(V); });
  Tensor x;
  if (gathered) {
    ++detail::gathered_count;
    using I = std::int64_t;
    const Tensor positions = slice(position_table(), 0, I(offset), I(offset + T));
    const Tensor table = reshape(reshape(tok.weight, {I(V), 1, I(D)}) + reshape(positions, {1, I(T), I(D)}), {I(V * T), I(D)});
    IndexArray rows = IndexArray::from_shape({B, T});
    for (std::size_t i = 0; i < rows.size(); ++i) rows.data()[i] = tokens.data()[i] * I(T) + I(i % T);
    mask.causal = causal(0);
    f.attention.emplace_back();
    f.inputs.emplace_back();
    x = blocks[0]->forward_gathered(table, rows, mask, blocks.size() == 1, blocks.size() == 1 ? nullptr : &f.inputs.back());
  } else {
    x = detail::embed(tok, position_table(), hook_embed, hook_pos_embed, tokens, offset);
  }
  for (std::size_t l = gathered ? 1 : 0; l < blocks.size(); ++l) {
    mask.causal = causal(l);
    f.attention.emplace_back();
    f.inputs.emplace_back();
    if (last_only && l + 1 == blocks.size()) {
      x = blocks[l]->forward_last(x, mask);
      break;
    }
    x = blocks[l]->forward(x, mask, need_weights || (pointer && l + 1 == blocks.size()), &f.attention.back(), &f.inputs.back(),
                           cache ? &(*cache)[l] : nullptr);
  }
  if (pointer) {
    const Tensor& s = f.attention.back().scores;  // (B, H, T, T)
    f.logits = reshape(slice(s, 1, 0, 1), {std::int64_t(s.size(0)), std::int64_t(s.size(2)), std::int64_t(s.size(3))});
  } else {
    f.logits = (*head)(ln_final_normalized(ln_final ? (*ln_final)(x) : x));
  }
  return f;
}

TransformerOutput Transformer::run_with_hooks(const IndexArray& tokens, const NamedHooks& hooks, bool need_weights,
                                              const MaskArray& key_padding) {
  return with_hooks(hooks, [&] { return forward(tokens, need_weights, key_padding); });
}

ActivationCache Transformer::run_with_cache(const IndexArray& tokens, const HookFilter& keep, const MaskArray& key_padding) {
  ActivationCache cache;
  cache.output = run_with_hooks(tokens, caching_hooks(cache, keep), false, key_padding);
  return cache;
}

Tensor Transformer::loss(const TransformerOutput& f, const IndexArray& targets, std::int64_t ignore_index) const {
  const std::int64_t classes = std::int64_t(f.logits.size(-1));
  const IndexArray flat = xt::reshape_view(targets, Shape{targets.size()});
  return cross_entropy(reshape(f.logits, {-1, classes}), flat, ignore_index);
}

Tensor Transformer::position_table() const {
  return pos ? pos->weight : sinusoids->table(tok.weight.dtype());
}

IndexArray Transformer::predictions(const Tensor& logits) {
  if (logits.dim() != 3) fail("predictions", "logits of shape {}: expected (B, T, C)", to_string(logits.shape()));
  const auto argmax_rows = [](const auto& v) {
    const std::size_t B = v.shape()[0], T = v.shape()[1], C = v.shape()[2];
    IndexArray out = IndexArray::from_shape({B, T});
    for (std::size_t i = 0; i < B * T; ++i) {
      const auto* row = v.data() + i * C;
      out.data()[i] = std::int64_t(std::max_element(row, row + C) - row);
    }
    return out;
  };
  return logits.dtype() == DType::float32 ? argmax_rows(logits.value<float>()) : argmax_rows(logits.value<double>());
}

void detail::write_model_config(const std::string& dir, const nlohmann::json& model) {
  write_atomically(dir + "/config.json", nlohmann::json{{"model", model}}.dump(2) + "\n");
}

nlohmann::json detail::read_model_config(const std::string& dir) {
  const std::string file = dir + "/config.json";
  const nlohmann::json j = detail::parse_json(read_file(file, 1 << 20), file, 3);
  return detail::FieldReader(j, file).at("model");
}

void save_config(const std::string& dir, const TransformerConfig& config) {
  detail::write_model_config(dir, detail::transformer_config_json(config));
}

TransformerConfig load_config(const std::string& dir) {
  return detail::read_transformer_config(detail::read_model_config(dir), dir + "/config.json", "model.");
}

detail::ModelWeights detail::read_model_weights(const std::string& dir, double parameters) {
  const double available = available_memory();
  const auto refuse = [&](double bytes) {
    if (bytes > available)
      throw std::runtime_error(fmt::format("{}/config.json: the model needs {:.0f} MiB for its weights, more than the "
                                           "{:.0f} MiB this machine has available",
                                           dir, bytes / (1 << 20), available / (1 << 20)));
  };
  refuse(4 * parameters);  // before the weights' file is read
  const auto folder = committed_checkpoint(dir);
  if (!folder) throw std::runtime_error(fmt::format("{}: the run has no checkpoint yet", dir));
  ModelWeights w{.file = *folder + "/model.safetensors", .weights = {}};
  w.weights = load_safetensors(w.file);
  // The model takes the dtype its weights were saved in (float64 for a gradient check's, say).
  if (!w.weights.tensors.empty()) w.dtype = w.weights.tensors.front().second.dtype();
  refuse(double(dtype_size(w.dtype)) * parameters);
  return w;
}

std::unique_ptr<Transformer> load_transformer(const std::string& dir) {
  return detail::load_model<Transformer>(dir, load_config(dir));
}

}  // namespace qkv::nn
