#pragma once
// Heatmaps of a matrix with labelled rows and columns: as text (shaded blocks, optionally in
// colour) for a terminal, and as a standalone SVG picture for a browser.
#include <string>
#include <utility>
#include <vector>

#include "qkv/core/tensor.hpp"

namespace qkv::cli {

struct Heatmap {
  Array<double> values;  // (rows, cols); a non-finite entry is masked and drawn empty
  std::vector<std::string> rows, cols;  // labels, one per row and column
  std::string title;
  // Signed data (scores, circuits): red above 0, blue below, scaled by the largest |value|.
  // Otherwise (attention weights): one colour from 0 up to the largest value.
  bool diverging = true;
  // What a row and a column are ("query token", "key token"), for the axis titles and each cell's
  // hover text: "query token ( → key token [: 0.98".
  std::string row_axis = "row", col_axis = "column";
  // Rows and columns are positions labelled by their tokens: the SVG shows each position's index
  // too ("query position", "key position"), and a cell's hover text reads
  // "query 3 (() → key 1 ([): 0.98".
  bool indexed = false;
  // Cells the SVG outlines (row, column): a true alignment, say.
  std::vector<std::pair<std::size_t, std::size_t>> marked{};
  std::string marked_legend{};  // what an outline means, under the picture
};

// The rows and columns an SVG heatmap draws at most; a larger matrix is sampled evenly (the first
// and last kept), and its title says so.
inline constexpr std::size_t heatmap_max_cells = 32;

// Two characters a cell: ░ ▒ ▓ █ by magnitude; with `color`, ANSI 256-colour red/blue (or
// orange for weights); without, negative cells use - = # instead of blocks.
std::string heatmap_text(const Heatmap& map, bool color);

// Text made safe inside an XML element or attribute: < > & and " escaped.
std::string escape_xml(const std::string& text);

// An <svg> element: cells with a tooltip each, upright row and column labels (a column's written
// downwards only when it cannot fit its cell), axis titles, a title and a colour bar.
std::string heatmap_svg(const Heatmap& map);

}  // namespace qkv::cli
