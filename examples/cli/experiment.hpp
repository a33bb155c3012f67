#pragma once
// `qkv experiment NAME`: rerunnable evidence for the teaching claims about W_q, W_k and W_v.
// Each experiment trains a grid of configurations over several seeds, and reports mean ± std per
// configuration as a markdown table, every run as JSON, and a chart as SVG.
//
//   ablations  brackets, rps, induction × projections untied | tied | identity | frozen
//              × embeddings learned | frozen
//   dhead      d_head 1, 2, 4, 8 on rps and brackets
//   scale      with and without 1/√d_head at d_head 4, 16, 64 (brackets)
//   kv         MHA, GQA and MQA on induction, with the KV-cache bytes per token
//   causal     brackets with causal and bidirectional attention, tied and untied
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace qkv::cli {

struct ExperimentOptions {
  std::string name;
  bool quick = false;      // one seed and fewer steps: under 2 minutes
  std::size_t seeds = 0;   // 0: 5, or 1 with quick
  std::string out;         // "" means runs/experiment-NAME
  std::size_t steps = 0;   // 0: the experiment's own; anything else overrides every run's
  std::size_t eval_batches = 32;  // of 32 held-out sequences, for the final accuracy
};

struct ExperimentResult {
  nlohmann::ordered_json runs;  // one object per run; see README
  std::string table;      // markdown: mean ± std per configuration
  std::string chart;      // SVG: accuracy per configuration
  std::vector<std::string> warnings;  // broken bounds (a bug): also at the end of the table
};

std::vector<std::string> experiment_names();

// Runs every configuration for every seed, writes OUT/results.json, OUT/NAME.svg and each run's
// folder under OUT/runs/, and shows progress on `progress`. Throws std::invalid_argument for an
// unknown name.
ExperimentResult run_experiment(const ExperimentOptions& options, std::ostream& progress, bool tty);

}  // namespace qkv::cli
