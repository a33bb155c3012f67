#pragma once
// `qkv inspect DIR --across-training` as a reader sees it: an AcrossTraining
// (analysis/across_training.hpp) as JSON, as tables, and as charts against the step.
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/analysis/across_training.hpp"

namespace qkv::report {

// {task, dir, sequences, seed, checkpoints: [{step, loss, accuracy, in_context: {early, late, score}
// or null, heads: [{layer, head, sigma, previous_token, duplicate_token, induction, prefix_matching,
// noising_share, logit_attribution}], composition: [{from, to, q, k, v}]}], half_way: {loss,
// in_context, heads: [{head, role, score, step}], composition: [{from, to, k_step}]}} (Formation);
// what a run has not (patching without a corrupted input, attribution with the pointer readout) is
// null.
nlohmann::json to_json(const analysis::AcrossTraining& across);

// A row a checkpoint: the held-out loss, accuracy and in-context score; then a table a head.
void print_across_training(std::ostream& out, const analysis::AcrossTraining& across);

// The charts against the step (log axis), as SVG: "across-training" (held-out loss, accuracy,
// next-token loss early and late) and "across-training-heads" (each measure a panel, a line a head,
// and the composition a line a pair and kind).
std::vector<std::pair<std::string, std::string>> across_training_charts(const analysis::AcrossTraining& across);

}  // namespace qkv::report
