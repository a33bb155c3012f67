#pragma once
// `qkv attribute DIR` as a reader sees it: a LogitAttribution (analysis/logit_attribution.hpp) as
// JSON and as a table.
#include <iosfwd>

#include <nlohmann/json.hpp>

#include "qkv/analysis/logit_attribution.hpp"

namespace qkv::report {

// {task, dir, sequences, positions, seed, logit_diff, embed, pos_embed, bias, layers: [{layer,
// attention, attn_bias, mlp (null without), heads: [{head, logit_diff}]}], total}.
nlohmann::json to_json(const analysis::LogitAttribution& attribution, const std::string& dir = "");

// The logit difference, then a row a part: embeddings, each head, each layer's attention and MLP,
// the biases, and their total.
void print_logit_attribution(std::ostream& out, const analysis::LogitAttribution& attribution, const std::string& dir = "");

}  // namespace qkv::report
