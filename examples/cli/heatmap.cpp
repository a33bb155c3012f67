#include "examples/cli/heatmap.hpp"

#include <algorithm>
#include <array>
#include <cmath>

#include <fmt/format.h>

namespace qkv::cli {

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
  // Column labels: one line when they fit a cell, else written downwards.
  const std::size_t label_lines = col_label <= 2 ? 1 : col_label;
  for (std::size_t line = 0; line < label_lines; ++line) {
    out += std::string(label_width + 1, ' ');
    for (const std::string& c : map.cols)
      out += fmt::format("{:<2}", col_label <= 2 ? c : line < c.size() ? c.substr(line, 1) : std::string());
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

std::string heatmap_svg(const Heatmap& map) {
  const std::size_t R = map.values.shape()[0], C = map.values.shape()[1];
  const double scale = scale_of(map);
  const double cell = std::clamp(360.0 / double(std::max(R, C)), 7.0, 22.0);
  std::size_t longest = 1;
  for (const auto& r : map.rows) longest = std::max(longest, r.size());
  for (const auto& c : map.cols) longest = std::max(longest, c.size());
  const double font = std::min(11.0, cell * 0.8);
  const double left = 8 + font * 0.62 * double(longest), top = 26 + font * 0.62 * double(longest);
  const double title_width = 8 + 7.3 * double(map.title.size());  // bold 12px monospace
  const double width = std::max(left + cell * double(C) + 80, title_width), height = std::max(top + cell * double(R) + 12, top + 150);
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" viewBox=\"0 0 {:.0f} {:.0f}\" "
      "font-family=\"DejaVu Sans Mono, monospace\" font-size=\"{:.1f}\" shape-rendering=\"crispEdges\">\n",
      width, height, width, height, font);
  s += fmt::format("<text x=\"4\" y=\"15\" font-size=\"12\" font-weight=\"bold\">{}</text>\n", escape_xml(map.title));
  for (std::size_t j = 0; j < C; ++j)  // column labels, rotated
    s += fmt::format("<text transform=\"translate({:.1f},{:.1f}) rotate(-90)\">{}</text>\n",
                     left + cell * (double(j) + 0.5) + font * 0.35, top - 4, escape_xml(map.cols[j]));
  for (std::size_t i = 0; i < R; ++i)
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", left - 4,
                     top + cell * (double(i) + 0.5) + font * 0.35, escape_xml(map.rows[i]));
  // Masked cells show the grey background; each other cell is a rectangle with its value as tooltip.
  s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"/>\n", left, top,
                   cell * double(C), cell * double(R), fill(map, NAN, scale));
  for (std::size_t i = 0; i < R; ++i)
    for (std::size_t j = 0; j < C; ++j) {
      const double v = map.values(i, j);
      if (!std::isfinite(v)) continue;
      s += fmt::format(
          "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"><title>{} → {}: {}</title></rect>\n",
          left + cell * double(j), top + cell * double(i), cell, cell, fill(map, v, scale), escape_xml(map.rows[i]),
          escape_xml(map.cols[j]), number(v));
    }
  s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" stroke=\"#888\"/>\n",
                   left, top, cell * double(C), cell * double(R));
  // The colour bar: top = +scale, bottom = −scale (or 0 for weights).
  const double bx = left + cell * double(C) + 14, bh = 120;
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

}  // namespace qkv::cli
