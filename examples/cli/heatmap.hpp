#pragma once
// Heatmaps of a matrix with labelled rows and columns: as text (shaded blocks, optionally in
// colour) for a terminal, and as a standalone SVG picture for a browser.
#include <string>
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
};

// Two characters a cell: ░ ▒ ▓ █ by magnitude; with `color`, ANSI 256-colour red/blue (or
// orange for weights); without, negative cells use - = # instead of blocks.
std::string heatmap_text(const Heatmap& map, bool color);

// Text made safe inside an XML element or attribute: < > & and " escaped.
std::string escape_xml(const std::string& text);

// An <svg> element: cells with a tooltip each, row and column labels, a title and a colour bar.
std::string heatmap_svg(const Heatmap& map);

}  // namespace qkv::cli
