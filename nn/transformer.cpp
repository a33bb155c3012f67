#include "qkv/nn/transformer.hpp"

#include <algorithm>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

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
const char* name_of(Projection p) {
  return p == Projection::learned ? "learned" : p == Projection::frozen ? "frozen" : "identity";
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
  if (c.proj == Projection::identity && shared_kv)
    config_error("kv_heads", "is {}: identity projections need as many kv heads as heads ({})", c.kv_heads, c.heads);
  if (c.proj == Projection::identity && c.d_head != 0 && c.d_head * c.heads != c.d_model)
    config_error("d_head", "is {}: identity projections need d_head · heads = d_model ({} · {} ≠ {})", c.d_head,
                 c.d_head, c.heads, c.d_model);
}

std::size_t head_dim(const TransformerConfig& c) { return c.d_head ? c.d_head : c.d_model / c.heads; }

bool symmetric_scores(const TransformerConfig& c) { return c.qk != QK::untied || c.proj == Projection::identity; }

double parameter_count(const TransformerConfig& c) {
  const double D = double(c.d_model), H = double(c.heads), Hkv = double(c.kv_heads ? c.kv_heads : c.heads);
  const double dh = double(head_dim(c));
  // q, k and v: each a (heads · d_head, D) weight and its bias; tied k is q; identity has none.
  const double qkv_heads = c.proj == Projection::identity ? 0 : c.qk != QK::untied ? H + Hkv : H + 2 * Hkv;
  const double attention = qkv_heads * dh * (D + 1) + H * dh * D + D;
  const double mlp = c.mlp ? 2 * D + 4 * D * (D + 1) + D * (4 * D + 1) : 0;
  const double head = c.readout == Readout::token ? double(c.n_classes) * (D + 1) : 0;
  const double positions = c.positions == Positions::learned ? double(c.max_len) * D : 0;
  return double(c.vocab_size) * D + positions + double(c.layers) * (2 * D + attention + mlp) + 2 * D + head;
}

nlohmann::json detail::transformer_config_json(const TransformerConfig& c) {
  return {{"vocab_size", c.vocab_size}, {"n_classes", c.n_classes}, {"max_len", c.max_len},
          {"readout", name_of(c.readout)}, {"causal", c.causal}, {"layers", c.layers}, {"d_model", c.d_model},
          {"heads", c.heads}, {"d_head", c.d_head}, {"kv_heads", c.kv_heads}, {"qk", name_of(c.qk)},
          {"proj", name_of(c.proj)}, {"scale", c.scale}, {"mlp", c.mlp},
          {"embeddings", c.frozen_embeddings ? "frozen" : "learned"}, {"positions", name_of(c.positions)},
          {"causal_layers", c.causal_layers}};
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
  constexpr std::uint64_t most = TransformerConfig::max_width;
  TransformerConfig c;
  c.vocab_size = m.count("vocab_size", 1, most);
  c.n_classes = m.count("n_classes", 0, most);
  c.max_len = m.count("max_len", 1, most);
  c.readout = detail::parse_enum(m, "readout", all_readouts);
  c.causal = m.flag("causal");
  c.layers = m.count("layers", 1, TransformerConfig::max_layers);
  c.d_model = m.count("d_model", 1, most);
  c.heads = m.count("heads", 1, most);
  c.d_head = m.count("d_head", 0, most);
  c.kv_heads = m.count("kv_heads", 0, most);
  c.qk = detail::parse_enum(m, "qk", all_qk);
  c.proj = detail::parse_enum(m, "proj", all_projections);
  c.scale = m.flag("scale");
  c.mlp = m.flag("mlp");
  c.frozen_embeddings = m.choice("embeddings", {"learned", "frozen"}) == "frozen";
  if (m.has("positions")) c.positions = detail::parse_enum(m, "positions", all_positions);  // absent from older runs
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

namespace {

// A block's points before its attention's (hook_resid_pre, ln1.hook_normalized); the rest come after.
constexpr std::size_t block_points_before_attention = 2;

std::vector<std::string> block_hook_names(bool mlp) {
  std::vector<std::string> names = {"hook_resid_pre", "ln1.hook_normalized", "hook_attn_out"};
  if (mlp) for (const std::string& n : detail::mlp_hook_names()) names.push_back(n);
  names.push_back("hook_resid_post");
  return names;
}

// The model's points before its blocks' (hook_embed, hook_pos_embed); the rest come after.
constexpr std::size_t model_points_before_blocks = 2;

std::vector<std::string> model_hook_names(Readout readout) {
  std::vector<std::string> names = {"hook_embed", "hook_pos_embed"};
  if (readout == Readout::token) names.push_back("ln_final.hook_normalized");
  return names;
}

}  // namespace

TransformerBlock::TransformerBlock(const TransformerConfig& c, Generator& gen)
    : ln1(c.d_model, 1e-5, true, c.dtype), attn(detail::attention_options(c), gen), hooks(block_hook_names(c.mlp)) {
  register_module("ln1", ln1);
  register_module("attn", attn);
  if (c.mlp) {
    detail::make_mlp(c.d_model, c.dtype, gen, ln2, fc, proj);
    register_module("ln2", *ln2);
    register_module("fc", *fc);
    register_module("proj", *proj);
  }
}

Tensor TransformerBlock::forward(const Tensor& x_in, const AttentionMask& mask, bool need_weights, AttentionResult* attention,
                                 Tensor* input, KVCache* cache) const {
  Tensor x = hooks.run("hook_resid_pre", x_in);
  const Tensor normalized = hooks.run("ln1.hook_normalized", ln1(x));
  AttentionResult r = attn.forward(normalized, mask, need_weights, cache);
  r.output = hooks.run("hook_attn_out", r.output);
  x = detail::mlp_residual(x + r.output, ln2.get(), fc.get(), proj.get(), hooks);
  if (attention) *attention = std::move(r);
  if (input) *input = normalized;
  return hooks.run("hook_resid_post", x);
}

namespace detail {

Tensor embed(const Embedding& tok, const Tensor& table, const HookPoints& hooks, const IndexArray& tokens, std::size_t offset) {
  const std::size_t T = tokens.shape()[1];
  Tensor positions = slice(table, 0, std::int64_t(offset), std::int64_t(offset + T));  // (T, D), added to every sequence
  if (!hooks.empty()) {  // a hook sees them per sequence, (B, T, D), as TransformerLens shows them
    const std::vector<Tensor> copies(tokens.shape()[0], reshape(positions, {1, std::int64_t(T), -1}));
    positions = concat(copies, 0);
  }
  const Tensor embedded = hooks.run("hook_embed", tok(tokens));  // before hook_pos_embed, in this order
  return embedded + hooks.run("hook_pos_embed", positions);
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
  if (!c.scale) o.scale = 1.0;
  return o;
}

void make_mlp(std::size_t d_model, DType dtype, Generator& gen, std::unique_ptr<LayerNorm>& ln2, std::unique_ptr<Linear>& fc,
              std::unique_ptr<Linear>& proj) {
  ln2 = std::make_unique<LayerNorm>(d_model, 1e-5, true, dtype);
  fc = std::make_unique<Linear>(d_model, 4 * d_model, true, dtype, gen);
  proj = std::make_unique<Linear>(4 * d_model, d_model, true, dtype, gen);
}

std::vector<std::string> mlp_hook_names() {
  return {"hook_resid_mid", "ln2.hook_normalized", "mlp.hook_pre", "mlp.hook_post", "hook_mlp_out"};
}

Tensor mlp_residual(const Tensor& x_in, const LayerNorm* ln2, const Linear* fc, const Linear* proj, const HookPoints& h) {
  if (!fc) return x_in;
  const Tensor x = h.run("hook_resid_mid", x_in);
  const Tensor pre = h.run("mlp.hook_pre", (*fc)(h.run("ln2.hook_normalized", (*ln2)(x))));
  return x + h.run("hook_mlp_out", (*proj)(h.run("mlp.hook_post", gelu(pre))));
}

}  // namespace detail

Transformer::Transformer(const TransformerConfig& c, Generator& gen)
    : tok(checked(c).vocab_size, c.d_model, c.dtype, gen),
      ln_f(c.d_model, 1e-5, true, c.dtype),
      config_(c),
      hooks_(model_hook_names(c.readout)) {
  register_module("tok", tok);
  if (c.positions == Positions::learned) {
    pos = std::make_unique<LearnedPositionalEncoding>(c.max_len, c.d_model, c.dtype, gen);
    register_module("pos", *pos);
  } else {
    sinusoids = std::make_unique<SinusoidalPositionalEncoding>(c.max_len, c.d_model);
  }
  for (std::size_t l = 0; l < c.layers; ++l) {
    blocks.push_back(std::make_unique<TransformerBlock>(c, gen));
    register_module("layers." + std::to_string(l), *blocks.back());
    blocks.back()->hooks.set_prefix(fmt::format("blocks.{}.", l));
    blocks.back()->attn.hooks.set_prefix(fmt::format("blocks.{}.attn.", l));
  }
  register_module("ln_f", ln_f);
  if (c.readout == Readout::token) {
    head = std::make_unique<Linear>(c.d_model, c.n_classes, true, c.dtype, gen);
    register_module("head", *head);
  }
  if (c.frozen_embeddings) {
    std::vector<Module*> frozen{&tok, &ln_f};
    if (pos) frozen.push_back(pos.get());
    for (const auto& b : blocks) {
      frozen.push_back(&b->ln1);
      if (b->ln2) frozen.push_back(b->ln2.get());
    }
    for (Module* m : frozen)
      for (Tensor& t : m->parameters()) t.requires_grad_(false);
  }
}

bool layer_is_causal(const TransformerConfig& c, std::size_t l) {
  return c.causal_layers.empty() ? c.causal : bool(c.causal_layers.at(l));
}

bool Transformer::causal(std::size_t l) const { return layer_is_causal(config_, l); }

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
                                   std::vector<KVCache>* cache) const {
  if (tokens.dimension() != 2)
    fail("Transformer", "tokens of shape {}: expected (batch, positions)", to_string(to_shape(tokens.shape())));
  const std::size_t offset = cache ? (*cache)[0].length() : 0, T = tokens.shape()[1];
  if (offset + T > config_.max_len)
    fail("Transformer", "positions {} to {} are beyond max_len {}", offset, offset + T, config_.max_len);
  TransformerOutput f;
  Tensor x = detail::embed(tok, position_table(), hooks_, tokens, offset);
  const bool pointer = config_.readout == Readout::pointer;
  AttentionMask mask{.key_padding = key_padding};  // one copy of the padding for every layer
  for (std::size_t l = 0; l < blocks.size(); ++l) {
    mask.causal = causal(l);
    f.attention.emplace_back();
    f.inputs.emplace_back();
    x = blocks[l]->forward(x, mask, need_weights || (pointer && l + 1 == blocks.size()), &f.attention.back(), &f.inputs.back(),
                           cache ? &(*cache)[l] : nullptr);
  }
  if (pointer) {
    const Tensor& s = f.attention.back().scores;  // (B, H, T, T)
    f.logits = reshape(slice(s, 1, 0, 1), {std::int64_t(s.size(0)), std::int64_t(s.size(2)), std::int64_t(s.size(3))});
  } else {
    f.logits = (*head)(hooks_.run("ln_final.hook_normalized", ln_f(x)));
  }
  return f;
}

std::vector<HookPoints*> Transformer::hook_points() {
  std::vector<HookPoints*> out = {&hooks_};
  for (const auto& b : blocks) out.insert(out.end(), {&b->hooks, &b->attn.hooks});
  return out;
}

std::vector<std::string> Transformer::hook_names() const {
  const std::vector<std::string> own = hooks_.names();
  const auto model_split = own.begin() + model_points_before_blocks;
  std::vector<std::string> names(own.begin(), model_split);
  for (const auto& b : blocks) {
    const std::vector<std::string> block = b->hooks.names(), attn = b->attn.hooks.names();
    const auto block_split = block.begin() + block_points_before_attention;
    names.insert(names.end(), block.begin(), block_split);
    names.insert(names.end(), attn.begin(), attn.end());
    names.insert(names.end(), block_split, block.end());
  }
  names.insert(names.end(), model_split, own.end());
  return names;
}

void Transformer::add_hook(const std::string& name, ForwardHook hook) {
  nn::add_hook(hook_points(), name, std::move(hook), "Transformer", hook_names());
}

void Transformer::reset_hooks() {
  for (HookPoints* points : hook_points()) points->clear();
}

TransformerOutput Transformer::run_with_hooks(const IndexArray& tokens,
                                              const std::vector<std::pair<std::string, ForwardHook>>& hooks,
                                              bool need_weights, const MaskArray& key_padding) {
  // The hooks go after the model's own at each point; however the forward ends, each point is cut
  // back to the hooks it had.
  struct Restore {
    std::vector<std::pair<HookPoints*, std::size_t>> sizes;
    ~Restore() {
      for (const auto& [points, n] : sizes) points->truncate(n);
    }
  } restore;
  for (HookPoints* points : hook_points()) restore.sizes.emplace_back(points, points->size());
  for (const auto& [name, hook] : hooks) add_hook(name, hook);
  return forward(tokens, need_weights, key_padding);
}

ActivationCache Transformer::run_with_cache(const IndexArray& tokens, const std::function<bool(const std::string&)>& keep,
                                            const MaskArray& key_padding) {
  ActivationCache cache;
  std::vector<std::pair<std::string, ForwardHook>> hooks;
  for (const std::string& name : hook_names())
    if (!keep || keep(name))
      hooks.emplace_back(name, [&cache](const Tensor& value, const std::string& point) {
        cache.activations.emplace_back(point, value.detach());
        return value;
      });
  cache.output = run_with_hooks(tokens, hooks, false, key_padding);
  return cache;
}

const Tensor& ActivationCache::operator[](const std::string& name) const {
  for (const auto& [point, value] : activations)
    if (point == name) return value;
  std::vector<std::string> names;
  for (const auto& a : activations) names.push_back(a.first);
  fail("ActivationCache", "no activation '{}' (it has {})", name, fmt::join(names, ", "));
}

bool ActivationCache::contains(const std::string& name) const {
  return std::any_of(activations.begin(), activations.end(), [&](const auto& a) { return a.first == name; });
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
