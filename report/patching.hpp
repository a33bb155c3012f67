#pragma once
// `qkv patch DIR` as a reader sees it: a Patching (analysis/patching.hpp) as JSON, as a table or
// heatmaps of text, and as SVG heatmaps.
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/analysis/patching.hpp"
#include "qkv/report/heatmap.hpp"

namespace qkv::report {

using analysis::Patching;

// {task, dir, corruption, component, direction, sequences, length, seed, by_position, positions,
// clean: {accuracy, loss, logit_diff}, corrupted: {…}, layers: [{layer, heads: [{head, patched:
// [{accuracy, loss, logit_diff, loss_share, logit_diff_share}, … a position each]}]}]}; the
// pattern's positions by position are query · length + key. A share that is not defined is null.
nlohmann::json to_json(const Patching& patching);
// {accuracy, loss, logit_diff}, null where not defined (attribution's estimates).
nlohmann::json to_json(const analysis::PatchScore& score);
// A number, or null where it is not finite (a share not defined).
nlohmann::json finite_or_null(double value);
// The header patching's tables start with: the sequences, then the clean and corrupted runs' metrics.
void print_patch_runs(std::ostream& out, const std::string& dir, const std::string& task, std::size_t sequences,
                      std::uint64_t seed, std::size_t length, const analysis::PatchScore& clean,
                      const analysis::PatchScore& corrupted, const std::string& corruption);
// A share as a percentage with one decimal, "-" where it is not defined.
std::string percent(double share);

// The share of the loss each patch restores (denoising) or brings (noising), as heatmaps: layers ×
// heads for all positions at once; a row a layer (residual components) or head by position; and
// the pattern by position a query × key map a head. Named for files: "patch-z", "patch-pattern-L1H0".
std::vector<std::pair<std::string, Heatmap>> patching_heatmaps(const Patching& patching);

// The clean and corrupted metrics, then a table of every patch (all positions at once), or the
// heatmaps and the largest shares (by position).
void print_patching(std::ostream& out, const Patching& patching, bool color);

}  // namespace qkv::report
