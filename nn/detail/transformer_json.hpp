#pragma once
// TransformerConfig and EncoderDecoderConfig as JSON objects, for the readers and writers of
// config.json that hold one already (the public to_json/parse_*_config take text), and what the
// two models' loaders share.
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "qkv/nn/checkpoint.hpp"
#include "qkv/nn/detail/json.hpp"
#include "qkv/nn/safetensors.hpp"
#include "qkv/nn/seq2seq.hpp"
#include "qkv/nn/transformer.hpp"

namespace qkv::nn::detail {

nlohmann::json transformer_config_json(const TransformerConfig& config);
// Every field checked by type, range and name: std::runtime_error naming `file` and the field,
// prefixed by `prefix` ("model.").
TransformerConfig read_transformer_config(const nlohmann::json& object, const std::string& file,
                                          const std::string& prefix);
nlohmann::json encoder_decoder_config_json(const EncoderDecoderConfig& config);
EncoderDecoderConfig read_encoder_decoder_config(const nlohmann::json& object, const std::string& file,
                                                 const std::string& prefix);

// DIR/config.json as {"model": MODEL}, written atomically; and its "model" object back
// (std::runtime_error naming the file).
void write_model_config(const std::string& dir, const nlohmann::json& model);
nlohmann::json read_model_config(const std::string& dir);

// An option's value by its name, as config.json writes it.
template <class E, std::size_t N>
E parse_enum(const FieldReader& r, const char* key, const E (&values)[N]) {
  return *from_name(values, r.choice(key, names_of(values)));
}

// A config's fields, listed once for its writer and its reader: each is visited with its name in
// config.json and its member, v.count(name, member, lo, hi) for a size in [lo, hi],
// v.flag(name, member), v.option(name, member, values) for an enum; each with a last `true` when
// it may be absent (the member keeps its default).
template <class Config, class Visitor>
void attention_fields(Config& c, Visitor& v) {  // what both models' configs have
  constexpr std::uint64_t most = TransformerConfig::max_width;
  v.count("d_model", c.d_model, 1, most);
  v.count("heads", c.heads, 1, most);
  v.count("d_head", c.d_head, 0, most);
  v.option("qk", c.qk, all_qk);
  v.option("proj", c.proj, all_projections);
  v.flag("mlp", c.mlp);
}

template <class Visitor>
void config_fields(TransformerConfig& c, Visitor& v) {  // and embeddings and causal_layers, by hand
  constexpr std::uint64_t most = TransformerConfig::max_width;
  v.count("vocab_size", c.vocab_size, 1, most);
  v.count("n_classes", c.n_classes, 0, most);
  v.count("max_len", c.max_len, 1, most);
  v.option("readout", c.readout, all_readouts);
  v.flag("causal", c.causal);
  v.count("layers", c.layers, 1, TransformerConfig::max_layers);
  attention_fields(c, v);
  v.count("kv_heads", c.kv_heads, 0, most);
  v.flag("scale", c.scale);
  v.option("positions", c.positions, all_positions, true);  // absent from older runs: learned
  // Absent from runs written before they were options: 4·d_model, GELU, LayerNorm, biases, uniform.
  v.count("d_mlp", c.d_mlp, 0, most, true);
  v.option("activation", c.activation, all_activations, true);
  v.flag("layer_norm", c.layer_norm, true);
  v.flag("attention_bias", c.attention_bias, true);
  v.option("init", c.init, all_inits, true);
}

template <class Visitor>
void config_fields(EncoderDecoderConfig& c, Visitor& v) {
  constexpr std::uint64_t most = TransformerConfig::max_width, layers = TransformerConfig::max_layers;
  v.count("src_vocab", c.src_vocab, 1, most);
  v.count("tgt_vocab", c.tgt_vocab, 1, most);
  v.count("max_src_len", c.max_src_len, 1, most);
  v.count("max_tgt_len", c.max_tgt_len, 1, most);
  v.count("encoder_layers", c.encoder_layers, 1, layers);
  v.count("decoder_layers", c.decoder_layers, 1, layers);
  attention_fields(c, v);
  v.option("positions", c.positions, all_positions);
}

// The visitor that writes the fields into a JSON object.
struct FieldWriter {
  nlohmann::json& out;
  void count(const char* key, std::size_t value, std::uint64_t, std::uint64_t, bool = false) { out[key] = value; }
  void flag(const char* key, bool value, bool = false) { out[key] = value; }
  template <class E, std::size_t N>
  void option(const char* key, E value, const E (&)[N], bool = false) {
    out[key] = name_of(value);
  }
};

// The visitor that reads them, each checked by type and range (an optional one absent keeps the
// member's default).
struct FieldLoader {
  const FieldReader& in;
  void count(const char* key, std::size_t& value, std::uint64_t lo, std::uint64_t hi, bool optional = false) {
    if (!optional || in.has(key)) value = in.count(key, lo, hi);
  }
  void flag(const char* key, bool& value, bool optional = false) {
    if (!optional || in.has(key)) value = in.flag(key);
  }
  template <class E, std::size_t N>
  void option(const char* key, E& value, const E (&values)[N], bool optional = false) {
    if (!optional || in.has(key)) value = parse_enum(in, key, values);
  }
};

// The config as a JSON object, by its fields.
template <class Config>
nlohmann::json config_json(Config c) {
  nlohmann::json out = nlohmann::json::object();
  FieldWriter w{out};
  config_fields(c, w);
  return out;
}

// The committed checkpoint's model.safetensors of DIR, once a model of `parameters` elements is
// known to fit in the memory available (in float32 before the file is read, in the weights' own
// dtype after): std::runtime_error naming config.json or the file.
struct ModelWeights {
  std::string file;
  Safetensors weights;
  DType dtype = DType::float32;
};
ModelWeights read_model_weights(const std::string& dir, double parameters);

// The model of a run folder whose config.json holds `config`, with the committed checkpoint's
// weights, in their dtype.
template <class Model, class Config>
std::unique_ptr<Model> load_model(const std::string& dir, Config config) {
  const ModelWeights w = read_model_weights(dir, parameter_count(config));
  config.dtype = w.dtype;
  Generator gen(0);
  auto model = std::make_unique<Model>(config, gen);
  load_weights(w.weights, w.file, *model);
  return model;
}

}  // namespace qkv::nn::detail
