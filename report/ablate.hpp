#pragma once
// `qkv ablate DIR` as a reader sees it: an Ablation (analysis/ablate.hpp) as JSON or as a table.
#include <iosfwd>

#include <nlohmann/json.hpp>

#include "qkv/analysis/ablate.hpp"

namespace qkv::report {

using analysis::Ablation;

// {task, dir, sequences, seed, clean: {accuracy, loss}, corruption, corrupted, heads: [{layer,
// head, name, read, zero, mean, noised, denoised, noising_share, denoising_share, needed}],
// needed: ["L0H1", …]}.
nlohmann::json to_json(const Ablation& ablation);

// A table, a head a row, and the heads the task needs.
void print_ablation(std::ostream& out, const Ablation& ablation);

}  // namespace qkv::report
