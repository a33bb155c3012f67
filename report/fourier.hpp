#pragma once
// `qkv inspect DIR --fourier` as a reader sees it: a FourierRun (analysis/fourier.hpp) as JSON and
// as tables.
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/analysis/fourier.hpp"

namespace qkv::report {

// One analysis: {p, key_frequencies, found, embed, unembed (norm per frequency 0 … p/2),
// neurons_per_frequency, neurons: [{frequency, share}], heads: [[{frequency, share}]], train_loss,
// test_loss, train_accuracy, test_accuracy, restricted_loss, restricted_accuracy, excluded_loss,
// excluded_accuracy, weight_norm}.
nlohmann::json to_json(const analysis::FourierAnalysis& analysis);
// {dir, final: ANALYSIS, along: [{step, ...ANALYSIS}]}.
nlohmann::json to_json(const analysis::FourierRun& run);

// The final model's key frequencies, norms, neurons, heads and losses; then a row a kept checkpoint.
void print_fourier(std::ostream& out, const analysis::FourierRun& run);

// The paper's figures against the step (log axis) from the kept checkpoints, as SVG: "fourier-loss"
// (training and held-out loss, log scale), "fourier-progress" (the restricted and excluded losses
// beside the held-out one, log scale), "fourier-weight-norm" and "fourier-key-norms" (the
// embedding's norm along each key frequency, and the share of its norm² they hold). None without kept
// checkpoints.
std::vector<std::pair<std::string, std::string>> fourier_charts(const analysis::FourierRun& run);

}  // namespace qkv::report
