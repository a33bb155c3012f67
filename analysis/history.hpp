#pragma once
// A run's training, read back from its folder: metrics.jsonl (train's log) and snapshots.jsonl,
// what the heads look like along training (report/snapshots.hpp writes them).
//
// A snapshot line: {step, accuracy (held-out: the final evaluation's sequences), input (the task's typical
// input, token ids), layers: [{heads: [{sigma, antisymmetry, score_asymmetry, TARGET_attention
// (pointer tasks), qk_circuit (d_model × d_model), attention (T × T on the input, null where
// masked)}]}], composition: [{from, to, q, k, v}] (as qkv inspect --json), probes: {name: value}}.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/analysis/inspect.hpp"

namespace qkv::analysis {

// How deep a snapshot's JSON nests: {layers: [{heads: [{qk_circuit: [[…]]}]}]}.
inline constexpr int snapshot_max_depth = 7;

// The snapshots.jsonl and metrics.jsonl of a run folder, one object per line; a last line cut
// short (a kill while it was written) is left out, any other line that is not a JSON object throws
// std::runtime_error naming the file and the line. A file that is not there gives none.
std::vector<nlohmann::json> read_json_lines(const std::string& path);
// The same from the file's text; `path` names it in messages.
std::vector<nlohmann::json> parse_json_lines(std::string_view text, const std::string& path);

// A run folder's metrics.jsonl and snapshots.jsonl (either may be missing: none of it), of the run
// whose model config.json records as `model`. A line without a field the history needs, with a
// field of the wrong type, a step past max_steps, a snapshot whose layers, heads, input or
// composition do not fit `model` (more layers or heads, an input longer than its positions or with
// tokens outside its vocabulary, a composition between heads it has not), or whose input length
// differs from the first's, throws std::runtime_error naming the file, the line and the fault.
TrainingHistory read_history(const std::string& dir, const nn::TransformerConfig& model);
// The same from the two files' texts ("" for a file that is not there); `dir` names them.
TrainingHistory parse_history(std::string_view metrics, std::string_view snapshots, const nn::TransformerConfig& model,
                              const std::string& dir);

}  // namespace qkv::analysis
