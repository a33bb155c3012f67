#pragma once
// Heatmaps of a matrix with labelled rows and columns: as text (shaded blocks, optionally in
// colour) for a terminal, and as a standalone SVG picture for a browser.
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/core/tensor.hpp"

namespace qkv::report {

// `value` as <script type="application/json" id="ID">, written so that no string in it can close
// the element ("</" as "<\/"), for a page's script to read.
std::string json_script(const std::string& id, const nlohmann::json& value);

// A head's name in every report: "L1H0".
std::string head_label(std::size_t layer, std::size_t head);

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

// How an SVG heatmap holds its cells: as elements, a rectangle each with its value as hover text
// (a picture that stands alone), or packed into attributes of their group, each cell's colour and
// value, which heatmap_script turns into those elements in the page that shows the picture: a
// tenth of the bytes.
enum class Cells { elements, packed };

// An <svg> element: cells with a tooltip each, upright row and column labels (column labels on
// two or three lines in turn when one line would run them together; written downwards only when
// even that cannot fit them), axis titles, a title and a colour bar.
std::string heatmap_svg(const Heatmap& map, Cells cells = Cells::elements);

// Each (name, svg) as DIR/NAME.svg, written atomically, DIR made first; the paths written, in order.
std::vector<std::string> write_svg_files(const std::string& dir, const std::vector<std::pair<std::string, std::string>>& svgs);

// SVG pictures of a page that draws each when it is shown: every distinct line of all of them kept
// once (the labels, scales and axis titles of one head's pictures are those of the next head's),
// a picture as a placeholder that lists its lines.
class PicturePack {
 public:
  // The placeholder of `svg`: <div class="picture" data-lines="3 4 5 …"></div>.
  std::string add(const std::string& svg);
  // The lines: <script type="application/json" id="picture-lines">[…]</script>.
  std::string lines_script() const;

 private:
  std::vector<std::string> lines_;
  std::unordered_map<std::string, std::size_t> index_;
};

// The script of a page of packed pictures and heatmaps (JavaScript, no <script> tag):
// showPictures(element) puts the pictures of the placeholders within `element` in their place and
// draws the packed cells of its heatmaps.
std::string heatmap_script();

}  // namespace qkv::report
