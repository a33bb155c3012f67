#pragma once
// `qkv inspect DIR` of a seq2seq run as a reader sees it: an AlignmentInspection
// (analysis/alignment.hpp) as JSON, as tables and heatmaps, as an HTML page, or as SVG files.
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/analysis/alignment.hpp"

namespace qkv::report {

using analysis::AlignmentInspection;

// {task, config, source: {tokens, names}, output: {tokens, names, written, expected}, alignment,
// held_out_sequences, cross_attention: [{layer, head, weights, alignment_on_input,
// alignment_held_out, top1_held_out, sigma}], any_head_top1 (per layer), encoder_attention, decoder_attention ([layer][head] matrices)}.
nlohmann::json to_json(const AlignmentInspection& inspection);
void print_report(std::ostream& out, const AlignmentInspection& inspection, bool color);
// The page: the table, the training (training_html) and every picture.
std::string to_html(const AlignmentInspection& inspection);
// L{l}H{h}-cross-attention.svg, encoder-L{l}H{h}-attention.svg, decoder-L{l}H{h}-attention.svg, and
// with a history training.svg.
std::vector<std::string> write_svgs(const AlignmentInspection& inspection, const std::string& dir);

}  // namespace qkv::report
