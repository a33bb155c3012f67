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
