#pragma once
// Measurements a sweep's runs may add to the built-in ones, by name (a sweep file's "measure"):
//
//   init_attention  at init: the mean entropy and largest weight of the attention rows, and
//                   ‖∂loss/∂W_q‖ on one training batch (what 1/√d_head does)
//   kv_cache        at the end: the bytes the KV caches hold per token of a sequence (GQA, MQA)
//   self_attention  at the end: how much each query attends its own position and its own token,
//                   and how much the queries' lengths |q_i| differ (what a Gram matrix of tied
//                   heads favours)
//   token_table     at the end: the readout head's token table, by the tokens' names
//   composition     at init and at the end: each earlier head's Q-, K- and V-composition into each
//                   later head
//   heads           at the end: each head's previous-token, duplicate-token and induction scores
//                   (TransformerLens's head detectors), as `qkv inspect` shows them
//   ablation        at the end: each head ablated and patched, as `qkv ablate` does
//   alignment       at the end of a seq2seq run: its cross-attention against the task's true
//                   alignment, and the exact match of greedy decoding
//   longer_lengths  at the end: accuracy on the task's longer sequences than it trains on
//   grokking        after a modadd run: the steps of grokking and its progress measures, from its log
//                   and kept checkpoints (analysis::grokking)
#include <functional>
#include <string>
#include <vector>

#include "qkv/sweep/measure.hpp"
#include "qkv/tasks/registry.hpp"

namespace qkv::sweep {

struct Measurement {
  std::string name, help;
  std::vector<tasks::Column> columns;  // what it adds to a run, as a table shows it
  Extras extras;
  // Why it cannot measure a run ("" when it can), asked before anything trains.
  std::function<std::string(const tasks::TrainOptions&)> check{};
};

const std::vector<Measurement>& measurement_registry();
// Throws std::invalid_argument naming it and listing the known ones.
const Measurement& measurement(const std::string& name);
// The measurements' extras as one, in the order given.
Extras extras_of(const std::vector<std::string>& names);
// Extras that run each part's in turn.
Extras chained(std::vector<Extras> parts);

}  // namespace qkv::sweep
