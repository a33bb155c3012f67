#pragma once
// TransformerConfig as a JSON object, for the readers and writers of config.json that hold one
// already (the public to_json/parse_transformer_config take text).
#include <string>

#include <nlohmann/json.hpp>

#include "qkv/nn/transformer.hpp"

namespace qkv::nn::detail {

nlohmann::json transformer_config_json(const TransformerConfig& config);
// Every field checked by type, range and name: std::runtime_error naming `file` and the field,
// prefixed by `prefix` ("model.").
TransformerConfig read_transformer_config(const nlohmann::json& object, const std::string& file,
                                          const std::string& prefix);

}  // namespace qkv::nn::detail
