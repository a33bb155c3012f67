#include "qkv/report/heatmap.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "qkv/nn/files.hpp"

namespace qkv::report {

std::string head_label(std::size_t layer, std::size_t head) { return fmt::format("L{}H{}", layer, head); }

namespace {

// The largest |value| (diverging) or value (weights) among finite entries; 0 when none.
double scale_of(const Heatmap& map) {
  double top = 0;
  for (double v : map.values)
    if (std::isfinite(v)) top = std::max(top, std::abs(v));
  return top;
}

// 0 … 4: how full a cell is, by |v| / scale.
int level(double magnitude) {
  if (magnitude < 0.1) return 0;
  if (magnitude < 0.3) return 1;
  if (magnitude < 0.55) return 2;
  if (magnitude < 0.8) return 3;
  return 4;
}

struct Rgb {
  double r, g, b;
};

Rgb mix(Rgb a, Rgb b, double t) { return {a.r + (b.r - a.r) * t, a.g + (b.g - a.g) * t, a.b + (b.b - a.b) * t}; }

std::string hex(Rgb c) {
  const auto byte = [](double v) { return int(std::lround(std::clamp(v, 0.0, 255.0))); };
  return fmt::format("#{:02x}{:02x}{:02x}", byte(c.r), byte(c.g), byte(c.b));
}

// ColorBrewer's RdBu ends and a light middle; a white-to-navy ramp for weights.
constexpr Rgb red{178, 24, 43}, white{247, 247, 247}, blue{33, 102, 172}, navy{8, 48, 107}, paper{255, 255, 255};

std::string fill(const Heatmap& map, double v, double scale) {
  if (!std::isfinite(v)) return "#d9d9d9";
  const double t = scale > 0 ? std::clamp(v / scale, -1.0, 1.0) : 0.0;
  if (!map.diverging) return hex(mix(paper, navy, std::max(t, 0.0)));
  return hex(t >= 0 ? mix(white, red, t) : mix(white, blue, -t));
}

std::string number(double v) {
  if (!std::isfinite(v)) return v > 0 ? "inf" : v < 0 ? "-inf" : "nan";
  return fmt::format("{:.3g}", v);
}

}  // namespace

std::string escape_xml(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string heatmap_text(const Heatmap& map, bool color) {
  const std::size_t R = map.values.shape()[0], C = map.values.shape()[1];
  const double scale = scale_of(map);
  std::size_t label_width = 0;
  for (const auto& r : map.rows) label_width = std::max(label_width, r.size());
  std::size_t col_label = 0;
  for (const auto& c : map.cols) col_label = std::max(col_label, c.size());

  static const std::array<const char*, 5> blocks = {"  ", "░░", "▒▒", "▓▓", "██"};
  static const std::array<const char*, 5> minus = {"  ", "--", "==", "##", "##"};
  // ANSI 256-colour ramps, light to strong.
  static const std::array<int, 5> reds = {224, 217, 210, 203, 160}, blues = {189, 153, 111, 69, 27},
                                   oranges = {230, 229, 221, 214, 202};
  std::string out = map.title + "\n";
  // Column labels: one line when they are single characters (two would run into their
  // neighbours' without a space between), else written downwards.
  const std::size_t label_lines = col_label <= 1 ? 1 : col_label;
  for (std::size_t line = 0; line < label_lines; ++line) {
    out += std::string(label_width + 1, ' ');
    for (const std::string& c : map.cols)
      out += fmt::format("{:<2}", label_lines == 1 ? c : line < c.size() ? c.substr(line, 1) : std::string());
    out += "\n";
  }
  for (std::size_t i = 0; i < R; ++i) {
    out += fmt::format("{:>{}} ", map.rows[i], label_width);
    for (std::size_t j = 0; j < C; ++j) {
      const double v = map.values(i, j);
      if (!std::isfinite(v)) {
        out += color ? "\x1b[38;5;240m··\x1b[0m" : "··";
        continue;
      }
      const int l = level(scale > 0 ? std::abs(v) / scale : 0);
      if (color) {
        const int code = !map.diverging ? oranges[l] : v >= 0 ? reds[l] : blues[l];
        out += fmt::format("\x1b[38;5;{}m{}\x1b[0m", code, l == 0 ? "░░" : blocks[l]);
      } else {
        out += map.diverging && v < 0 ? minus[l] : blocks[l];
      }
    }
    out += "\n";
  }
  if (map.diverging)
    out += fmt::format("{:>{}} █ |v| ≥ 0.8·{}, ▓ ≥ 0.55, ▒ ≥ 0.3, ░ ≥ 0.1; {}, ·· masked\n", "", label_width,
                       number(scale), color ? "red > 0, blue < 0" : "- = # below 0");
  else
    out += fmt::format("{:>{}} █ ≥ 0.8·{}, ▓ ≥ 0.55, ▒ ≥ 0.3, ░ ≥ 0.1, ·· masked\n", "", label_width, number(scale));
  return out;
}

namespace {

// At most `most` of 0 … n − 1, evenly spaced, the first and the last among them.
std::vector<std::size_t> sample(std::size_t n, std::size_t most) {
  std::vector<std::size_t> out;
  if (n <= most) {
    for (std::size_t i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  for (std::size_t k = 0; k < most; ++k) out.push_back((k * (n - 1) + (most - 1) / 2) / (most - 1));
  return out;
}

// The width of `text` in a font of `size` px: DejaVu Sans Mono's advance is 0.6 em (a little more for safety).
double text_width(const std::string& text, double size) {
  std::size_t glyphs = 0;
  for (unsigned char c : text) glyphs += (c & 0xC0) != 0x80;  // UTF-8: count the first byte of each character
  return 0.62 * size * double(glyphs);
}

// The room a label leaves on each side within its cells: 0.35 em, about a space, so that two
// labels side by side ("21" "12") do not read as one ("2112").
double label_gap(double size) { return 0.35 * size; }

// Whether `text` in a font of `size` px fits a room `room` px wide, with the gap beside it.
bool fits(const std::string& text, double size, double room) { return text_width(text, size) + label_gap(size) <= room; }

// The most characters of any label (at least 1).
std::size_t widest(const std::vector<std::string>& labels) {
  double most = 1;
  for (const auto& l : labels) most = std::max(most, text_width(l, 1) / 0.62);
  return std::size_t(most);
}

}  // namespace

std::string heatmap_svg(const Heatmap& map, Cells cells) {
  const std::size_t R = map.values.shape()[0], C = map.values.shape()[1];
  const std::vector<std::size_t> rows = sample(R, heatmap_max_cells), cols = sample(C, heatmap_max_cells);
  const double scale = scale_of(map);
  const double cell = std::clamp(std::floor(360.0 / double(std::max(rows.size(), cols.size()))), 8.0, 22.0);
  const double font = std::min(11.0, std::floor(cell * 0.8));
  // Column labels upright: on one line if each pair of neighbours fits its two cells with room
  // between them; else on two or three lines in turn, the neighbours on a line two or three cells
  // apart, on as few lines as give the full font (or the largest); in a smaller font down to 6 px;
  // written downwards only when even three lines at 6 px would not fit them.
  const std::string longest_col(widest(map.cols), 'x');
  double col_font = 0;
  std::size_t col_lines = 1;
  for (std::size_t n = 1; n <= 3 && col_font < font; ++n) {
    double pair = 1;  // the most characters of two labels n columns apart (of one, when none is)
    for (std::size_t c = 0; c < cols.size(); ++c)
      pair = std::max(pair, (text_width(map.cols[cols[c]], 1) +
                             (c + n < cols.size() ? text_width(map.cols[cols[c + n]], 1) : 0)) / 0.62);
    // Centres n cells apart: half of each label's width, and the gap between them.
    const auto fits_line = [&](double size) { return 0.62 * size * pair / 2 + label_gap(size) <= double(n) * cell; };
    double size = font;
    while (size > 6 && !fits_line(size)) --size;
    if (size > col_font && fits_line(size)) col_font = size, col_lines = n;
  }
  const bool upright = col_font >= 6;
  // Position indices: every k-th, so that each fits its cells.
  const double index_font = std::min(9.0, font);
  const std::string widest_index = std::to_string(std::max(R, C) - 1);
  std::size_t every = 1;
  for (std::size_t k : {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000})
    if (every = k; fits(widest_index, index_font, double(k) * cell)) break;
  const auto axis_title = [&](const std::string& axis) { return map.indexed ? axis + " position" : axis; };
  const bool sampled = rows.size() < R || cols.size() < C;

  const double title_h = sampled ? 36 : 22, axis_h = 14, index_h = map.indexed ? index_font + 4 : 0;
  const double line_h = col_font + 2;
  const double label_h = upright ? line_h * double(col_lines) + 2 : text_width(longest_col, font) + 6;
  const double top = title_h + axis_h + index_h + label_h;
  const double index_w = map.indexed ? text_width(widest_index, index_font) + 6 : 0;
  const double left = 18 + index_w + text_width(std::string(widest(map.rows), 'x'), font) + 6;
  const double grid_w = cell * double(cols.size()), grid_h = cell * double(rows.size());
  const double title_w = 8 + 7.3 * double(map.title.size());  // bold 12px
  // The legend of the marked cells, below the grid and the colour bar.
  const double legend_y = std::max(top + grid_h, top + 132) + 14, legend_w = 8 + 6.2 * double(map.marked_legend.size());
  const double width = std::ceil(std::max({left + grid_w + 80, title_w, legend_w}));
  const double height = std::ceil(std::max({top + grid_h + 12, top + 150, map.marked_legend.empty() ? 0 : legend_y + 6}));
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.0f}\" height=\"{1:.0f}\" viewBox=\"0 0 {0:.0f} {1:.0f}\" "
      "font-family=\"DejaVu Sans Mono, monospace\" font-size=\"{2:.0f}\">\n",
      width, height, font);
  s += fmt::format("<text x=\"4\" y=\"15\" font-size=\"12\" font-weight=\"bold\">{}</text>\n", escape_xml(map.title));
  if (sampled)
    s += fmt::format("<text x=\"4\" y=\"30\" font-size=\"10\" fill=\"#555\">{} of {} rows, {} of {} columns, evenly "
                     "spaced</text>\n",
                     rows.size(), R, cols.size(), C);
  // Axis titles: the columns' above them, the rows' along their left.
  s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" fill=\"#555\" text-anchor=\"middle\" "
                   "font-family=\"DejaVu Sans, sans-serif\">{} →</text>\n",
                   left + grid_w / 2, title_h + 10, escape_xml(axis_title(map.col_axis)));
  s += fmt::format("<text transform=\"translate(12,{:.1f}) rotate(-90)\" font-size=\"10\" fill=\"#555\" "
                   "text-anchor=\"middle\" font-family=\"DejaVu Sans, sans-serif\">{} ↓</text>\n",
                   top + grid_h / 2, escape_xml(axis_title(map.row_axis)));
  s += "<g fill=\"#777\" font-size=\"" + fmt::format("{:.0f}", index_font) + "\">\n";
  if (map.indexed) {
    // Every `every`-th drawn cell: of the positions themselves when none is left out.
    for (std::size_t c = 0; c < cols.size(); ++c)
      if (c % every == 0)
        s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", left + cell * (double(c) + 0.5),
                         title_h + axis_h + index_font, cols[c]);
    for (std::size_t r = 0; r < rows.size(); ++r)
      if (r % every == 0)
        s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", 18 + index_w - 4,
                         top + cell * (double(r) + 0.5) + index_font * 0.35, rows[r]);
  }
  s += "</g>\n";
  for (std::size_t c = 0; c < cols.size(); ++c) {
    const double x = left + cell * (double(c) + 0.5);
    if (upright)  // column c on line c mod col_lines, the first nearest the cells
      s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"{:.0f}\" text-anchor=\"middle\">{}</text>\n", x,
                       top - 4 - line_h * double(c % col_lines), col_font, escape_xml(map.cols[cols[c]]));
    else
      s += fmt::format("<text transform=\"translate({:.1f},{:.1f}) rotate(-90)\">{}</text>\n", x + font * 0.35, top - 4,
                       escape_xml(map.cols[cols[c]]));
  }
  for (std::size_t r = 0; r < rows.size(); ++r)
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", left - 4,
                     top + cell * (double(r) + 0.5) + font * 0.35, escape_xml(map.rows[rows[r]]));
  // Masked cells show the grey background; each other cell is a rectangle with its value as tooltip.
  s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.0f}\" height=\"{:.0f}\" fill=\"{}\"/>\n", left, top, grid_w,
                   grid_h, fill(map, NAN, scale));
  const auto name = [&](const std::string& axis, std::size_t i, const std::string& label) {
    return map.indexed ? fmt::format("{} {} ({})", axis, i, label) : fmt::format("{} {}", axis, label);
  };
  const std::string group = fmt::format("<g shape-rendering=\"crispEdges\" transform=\"translate({:.1f},{:.1f})\"", left, top);
  if (cells == Cells::packed) {
    // What heatmap_script needs to draw the cells as below: the names in their hover text, and
    // each cell's colour and value, row by row ("-" where masked).
    nlohmann::json row_names = nlohmann::json::array(), col_names = nlohmann::json::array();
    for (std::size_t r : rows) row_names.push_back(name(map.row_axis, r, map.rows[r]));
    for (std::size_t c : cols) col_names.push_back(name(map.col_axis, c, map.cols[c]));
    std::string packed;
    for (std::size_t r : rows)
      for (std::size_t c : cols) {
        const double v = map.values(r, c);
        if (!packed.empty()) packed += ' ';
        packed += std::isfinite(v) ? fmt::format("{}:{}", fill(map, v, scale).substr(1), number(v)) : "-";
      }
    const auto text = [](const nlohmann::json& j) { return escape_xml(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)); };
    // The cells on a line of their own, apart from what the pictures of other heads share (PicturePack).
    s += fmt::format("{} data-cell=\"{:.0f}\" data-rows=\"{}\" data-cols=\"{}\"\ndata-cells=\"{}\">\n", group, cell,
                     text(row_names), text(col_names), packed);
  } else {
    s += group + ">\n";
    for (std::size_t r = 0; r < rows.size(); ++r)
      for (std::size_t c = 0; c < cols.size(); ++c) {
        const double v = map.values(rows[r], cols[c]);
        if (!std::isfinite(v)) continue;
        s += fmt::format("<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"{:.0f}\" height=\"{:.0f}\" fill=\"{}\"><title>{} → {}: {}</title></rect>\n",
                         cell * double(c), cell * double(r), cell, cell, fill(map, v, scale),
                         escape_xml(name(map.row_axis, rows[r], map.rows[rows[r]])),
                         escape_xml(name(map.col_axis, cols[c], map.cols[cols[c]])), number(v));
      }
  }
  s += "</g>\n";
  // Outlines of the marked cells that are drawn.
  for (const auto& [r, c] : map.marked) {
    const auto row = std::find(rows.begin(), rows.end(), r), col = std::find(cols.begin(), cols.end(), c);
    if (row == rows.end() || col == cols.end()) continue;
    s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.0f}\" height=\"{:.0f}\" fill=\"none\" stroke=\"#1a9850\" "
                     "stroke-width=\"2\"/>\n",
                     left + cell * double(col - cols.begin()) + 1, top + cell * double(row - rows.begin()) + 1, cell - 2, cell - 2);
  }
  s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.0f}\" height=\"{:.0f}\" fill=\"none\" stroke=\"#888\"/>\n",
                   left, top, grid_w, grid_h);
  if (!map.marked_legend.empty())
    s += fmt::format("<text x=\"4\" y=\"{:.1f}\" font-size=\"10\" fill=\"#1a9850\" font-family=\"DejaVu Sans, sans-serif\">{}</text>\n",
                     legend_y, escape_xml(map.marked_legend));
  // The colour bar: top = +scale, bottom = −scale (or 0 for weights).
  const double bx = left + grid_w + 14, bh = 120;
  const int steps = 24;
  for (int k = 0; k < steps; ++k) {
    const double t = 1 - (double(k) + 0.5) / steps;  // 1 … 0
    const double v = map.diverging ? (2 * t - 1) * scale : t * scale;
    s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"{:.2f}\" fill=\"{}\"/>\n", bx,
                     top + bh * double(k) / steps, bh / steps + 0.3, fill(map, v, scale));
  }
  s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"{:.1f}\" fill=\"none\" stroke=\"#888\"/>\n", bx,
                   top, bh);
  s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\">{}</text>\n", bx + 16, top + 8, number(scale));
  s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\">{}</text>\n", bx + 16, top + bh,
                   map.diverging ? number(-scale) : "0");
  if (map.diverging)
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\">0</text>\n", bx + 16, top + bh / 2 + 4);
  s += "</svg>\n";
  return s;
}

std::string PicturePack::add(const std::string& svg) {
  std::string ids;
  for (std::size_t start = 0; start < svg.size();) {
    const std::size_t end = std::min(svg.find('\n', start), svg.size());
    const auto [at, added] = index_.try_emplace(svg.substr(start, end - start), lines_.size());
    if (added) lines_.push_back(at->first);
    if (!ids.empty()) ids += ' ';
    ids += std::to_string(at->second);
    start = end + 1;
  }
  return fmt::format("<div class=\"picture\" data-lines=\"{}\"></div>\n", ids);
}

std::string json_script(const std::string& id, const nlohmann::json& value) {
  const std::string json = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  // "</" written "<\/" (the same JSON string), so that no text can close the script element.
  std::string escaped;
  for (std::size_t i = 0; i < json.size(); ++i) {
    escaped += json[i];
    if (json[i] == '<' && i + 1 < json.size() && json[i + 1] == '/') escaped += '\\';
  }
  return "<script type=\"application/json\" id=\"" + id + "\">" + escaped + "</script>\n";
}

std::string PicturePack::lines_script() const { return json_script("picture-lines", nlohmann::json(lines_)); }

std::string heatmap_script() {
  // The cells as heatmap_svg draws them with Cells::elements, hover text "ROW → COLUMN: VALUE".
  return R"(function showPictures(root) {
  const lines = showPictures.lines ||= JSON.parse(document.getElementById('picture-lines').textContent);
  for (const slot of root.querySelectorAll('div.picture[data-lines]'))
    slot.outerHTML = slot.dataset.lines.split(' ').map(i => lines[i]).join('\n');
  const svg = 'http://www.w3.org/2000/svg';
  for (const group of root.querySelectorAll('g[data-cells]')) {
    const rows = JSON.parse(group.dataset.rows), cols = JSON.parse(group.dataset.cols), size = Number(group.dataset.cell);
    group.dataset.cells.split(' ').forEach((cell, i) => {
      if (cell === '-') return;
      const [fill, value] = cell.split(':'), r = Math.floor(i / cols.length), c = i % cols.length;
      const rect = document.createElementNS(svg, 'rect'), title = document.createElementNS(svg, 'title');
      for (const [key, v] of [['x', c * size], ['y', r * size], ['width', size], ['height', size], ['fill', '#' + fill]])
        rect.setAttribute(key, v);
      title.textContent = rows[r] + ' → ' + cols[c] + ': ' + value;
      rect.append(title);
      group.append(rect);
    });
    group.removeAttribute('data-cells');
  }
}
)";
}

std::vector<std::string> write_svg_files(const std::string& dir, const std::vector<std::pair<std::string, std::string>>& svgs) {
  std::filesystem::create_directories(dir);
  std::vector<std::string> files;
  for (const auto& [name, svg] : svgs) {
    files.push_back((std::filesystem::path(dir) / (name + ".svg")).string());
    nn::write_atomically(files.back(), svg);
  }
  return files;
}

}  // namespace qkv::report
