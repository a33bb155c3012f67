#pragma once
// `qkv inspect DIR` as a reader sees it: an Inspection (analysis/inspect.hpp) as JSON, as tables
// and heatmaps for a terminal, as a self-contained HTML page, or as SVG files; and a run's training
// as charts.
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/analysis/inspect.hpp"

namespace qkv::report {

using analysis::Inspection;
using analysis::TrainingHistory;

// A matrix as rows of numbers, null where not finite (masked).
nlohmann::json matrix_json(const Array<double>& a);
// How a report's title names the projections ("" for learned ones): ", identity projections".
std::string projection_text(nn::Projection proj);
// A self-contained HTML page's beginning, up to and with <body>: its title and style.
std::string page_start(const std::string& title);

// The charts of a run's training, by file name: "training", the loss and accuracy of
// metrics.jsonl (and held out, of snapshots.jsonl), and with snapshots "training-heads", each
// head's σ and score asymmetry, the composition and the probes along training. None for no history.
std::vector<std::pair<std::string, std::string>> training_charts(const TrainingHistory& history);
// The page's section of them, with what they show; "" for no history.
std::string training_html(const TrainingHistory& history);

// The numbers as JSON: {task, config, layers: [{heads: [{sigma, antisymmetry, singular_values,
// stable_rank, rank, eigenvalues ([re, im] pairs), token_qk: {tokens, scores}, ...}]}],
// input: {tokens, attention, scores, score_asymmetry, TARGET_attention (pointer tasks: opener_attention)},
// composition: [{from: "L0H1", to: "L1H0", from_layer, from_head, to_layer, to_head, q, k, v}]}.
nlohmann::json to_json(const Inspection& inspection);

// Tables and heatmaps of shaded blocks, in colour when `color`.
void print_report(std::ostream& out, const Inspection& inspection, bool color);

// One self-contained HTML page: the numbers, a legend, the training when the history has it, and
// every head's pictures, one head at a time, chosen by a link a head ("L1H0"): SVG heatmaps with
// axis labels and colour scales, whose cells (packed, heatmap_svg's Cells::packed) the page's
// script draws when the head is shown; no fetch.
std::string to_html(const Inspection& inspection);

// Each picture of the page as its own SVG file in `dir`: L{l}H{h}-{attention,token-qk,
// position-qk,qk-circuit}.svg, and with a training history training.svg, training-heads.svg and
// L{l}H{h}-step-{step}.svg (each head's attention at a few snapshots). Returns the files written.
std::vector<std::string> write_svgs(const Inspection& inspection, const std::string& dir);

}  // namespace qkv::report
