#include "qkv/report/charts.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include <fmt/format.h>

#include "qkv/report/heatmap.hpp"  // escape_xml

namespace qkv::report {

using Json = nlohmann::ordered_json;

std::vector<RunGroup> group_runs(const Json& runs) {
  std::vector<RunGroup> groups;
  for (const auto& run : runs) {
    const Json& labels = run.at("labels");
    auto it = std::find_if(groups.begin(), groups.end(), [&](const RunGroup& g) { return g.labels == labels; });
    if (it == groups.end()) it = groups.insert(groups.end(), RunGroup{labels, {}});
    it->runs.push_back(&run);
  }
  return groups;
}

const Json* value_at(const Json& run, const std::string& path) {
  const Json* at = &run;
  for (std::size_t from = 0;;) {
    const std::size_t dot = path.find('.', from);
    const std::string key = path.substr(from, dot == std::string::npos ? std::string::npos : dot - from);
    if (at->is_array()) {  // a list's element by its index
      if (key.empty() || key.find_first_not_of("0123456789") != std::string::npos || key.size() > 9) return nullptr;
      const std::size_t i = std::stoul(key);
      if (i >= at->size()) return nullptr;
      at = &at->at(i);
    } else {
      if (!at->is_object() || !at->contains(key)) return nullptr;
      at = &at->at(key);
    }
    if (dot == std::string::npos) return at;
    from = dot + 1;
  }
}

std::vector<double> run_values(const RunGroup& g, const char* key) {
  std::vector<double> v;
  for (const auto* r : g.runs)
    if (const Json* x = value_at(*r, key); x && !x->is_null()) v.push_back(x->is_boolean() ? double(x->get<bool>()) : x->get<double>());
  return v;
}

std::string label_text(const Json& labels) {
  std::string out;
  for (const auto& [key, value] : labels.items())
    out += (out.empty() ? "" : " / ") + (value.is_string() ? value.get<std::string>() : value.dump());
  return out;
}

namespace {

std::string svg_open(double width, double height) {
  return fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.0f}\" height=\"{1:.0f}\" viewBox=\"0 0 {0:.0f} {1:.0f}\" "
      "font-family=\"DejaVu Sans, sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height);
}

// Ten colours that stay apart for the common kinds of colour blindness (Tableau 10).
constexpr const char* palette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                   "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};

}  // namespace

std::string accuracy_chart(const std::string& name, const Json& runs) {
  const std::vector<RunGroup> groups = group_runs(runs);
  const double label_w = 260, plot_w = 400, row = 20, top = 40;
  const double bottom = top + row * double(groups.size());
  const auto x = [&](double acc) { return label_w + plot_w * std::clamp(acc, 0.0, 1.0); };
  std::string s = svg_open(label_w + plot_w + 30, bottom + 40);
  s += fmt::format("<text x=\"8\" y=\"18\" font-size=\"13\" font-weight=\"bold\">qkv experiment {}: held-out accuracy "
                   "(mean ± std over seeds; dots: seeds)</text>\n",
                   escape_xml(name));
  for (double tick = 0; tick <= 1.0001; tick += 0.2) {
    s += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#ddd\"/>\n", x(tick), top - 4,
                     bottom);
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#555\">{:.1f}</text>\n", x(tick),
                     bottom + 14, tick);
  }
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const RunGroup& g = groups[i];
    const double y = top + row * double(i);
    const std::vector<double> accuracies = run_values(g, "accuracy");
    const Stats a = stats(accuracies);
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", label_w - 6, y + row * 0.65,
                     escape_xml(label_text(g.labels)));
    s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#6baed6\"><title>{:.4f}</title></rect>\n",
                     label_w, y + 3, x(a.mean) - label_w, row - 6, a.mean);
    if (a.n > 1)
      s += fmt::format("<line x1=\"{0:.1f}\" x2=\"{1:.1f}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"#08306b\" stroke-width=\"1.5\"/>\n",
                       x(a.mean - a.sd), x(a.mean + a.sd), y + row / 2);
    for (double v : accuracies)
      s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.2\" fill=\"#08306b\"/>\n", x(v), y + row / 2);
  }
  s += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#b2182b\" stroke-dasharray=\"4 3\"/>\n",
                   x(2.0 / 3), top - 8, bottom);
  s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#b2182b\" text-anchor=\"middle\">2/3</text>\n", x(2.0 / 3), top - 10);
  return s + "</svg>\n";
}

std::string curves_chart(const std::string& name, const Json& runs, const std::string& key, const std::string& what) {
  // One line per configuration: at each step, the values of its seeds.
  std::vector<ChartLine> lines;
  std::size_t seeds = 0;
  for (const RunGroup& g : group_runs(runs)) {
    seeds = std::max(seeds, g.runs.size());
    Json rest = g.labels;
    ChartLine line;
    if (rest.contains("task") && rest.size() > 1) {
      line.panel = rest["task"].is_string() ? rest["task"].get<std::string>() : rest["task"].dump();
      rest.erase("task");
    }
    line.series = label_text(rest);
    for (const Json* run : g.runs)
      for (const Json& point : run->value("curve", Json::array()))
        if (point.contains(key) && !point.at(key).is_null())
          line.values[point.at("step").get<std::size_t>()].push_back(point.at(key).get<double>());
    if (!line.values.empty()) lines.push_back(std::move(line));
  }
  return steps_chart(fmt::format("qkv experiment {}: {}", name, what),
                     fmt::format("along training: the mean over {} seed(s); the band runs from the lowest seed to the highest", seeds),
                     lines, true);
}

std::string steps_chart(const std::string& title, const std::string& subtitle, const std::vector<ChartLine>& given,
                        bool shared_axis, bool log_values) {
  // On a log axis a line runs through its values' logarithms (their geometric mean), those not
  // above 0 left out.
  std::vector<ChartLine> logs;
  if (log_values)
    for (ChartLine line : given) {
      for (auto& [step, values] : line.values)
        for (double& v : values) v = v > 0 ? std::log10(v) : std::numeric_limits<double>::quiet_NaN();
      logs.push_back(std::move(line));
    }
  const std::vector<ChartLine>& lines = log_values ? logs : given;
  std::vector<std::string> panels, series;
  std::vector<bool> grey;                          // per series
  std::vector<double> top_value, bottom_value;     // per panel: the largest value (or 0), the smallest (or 0)
  std::vector<std::vector<std::size_t>> drawn;     // per panel: the series it draws, by index in `series`
  std::size_t last_step = 1;
  for (const ChartLine& line : lines) {
    const std::size_t panel = std::size_t(std::find(panels.begin(), panels.end(), line.panel) - panels.begin());
    if (panel == panels.size()) {
      const double none = std::numeric_limits<double>::infinity();  // a log axis need not hold 1
      panels.push_back(line.panel), top_value.push_back(log_values ? -none : 0), bottom_value.push_back(log_values ? none : 0);
      drawn.emplace_back();
    }
    double &top = top_value[panel], &bottom = bottom_value[panel];
    for (const auto& [step, values] : line.values)
      for (double v : values)
        if (std::isfinite(v)) top = std::max(top, v), bottom = std::min(bottom, v), last_step = std::max(last_step, step);
    const std::size_t c = std::size_t(std::find(series.begin(), series.end(), line.series) - series.begin());
    if (c == series.size()) series.push_back(line.series), grey.push_back(line.many);
    if (std::find(drawn[panel].begin(), drawn[panel].end(), c) == drawn[panel].end()) drawn[panel].push_back(c);
  }
  if (lines.empty()) return "";
  const auto colour_of = [&](std::size_t c) { return grey[c] ? "#aaa" : palette[c % std::size(palette)]; };
  // The value axis. Values in [0, 1] on a fixed axis; larger ones (asymmetry, up to 2; a loss) up
  // to the next half; below 0 (a share that goes the other way), down to the next half below; five
  // lines. Past 10 (a weight norm), from and to multiples of a round step: 1, 2, 2.5 or 5 times a
  // power of ten, four or five of them across the axis. On a log axis, whole decades around the
  // values.
  const auto round_step = [](double range) {
    const double unit = std::pow(10.0, std::floor(std::log10(range / 4)));
    for (double m : {1.0, 2.0, 2.5, 5.0})
      if (range / (m * unit) <= 5) return m * unit;
    return 10 * unit;
  };
  struct Axis {
    double bottom, top, every;  // every: the value between two lines
  };
  const auto axis = [&](double bottom, double top) -> Axis {
    if (log_values) {
      const double t = std::isfinite(top) ? std::ceil(top) : 1.0;
      const double b = std::isfinite(bottom) ? std::min(std::floor(bottom), t - 1) : 0.0;
      return {b, t, std::max(1.0, std::ceil((t - b) / 6))};  // one line a decade, or every second or third of many
    }
    if (top > 10) {
      const double step = round_step(top - std::min(bottom, 0.0));
      return {bottom >= 0 ? 0.0 : std::floor(bottom / step) * step, std::ceil(top / step) * step, step};
    }
    const double t = top <= 1 ? 1.0 : std::ceil(top * 2) / 2, b = bottom >= 0 ? 0.0 : std::floor(bottom * 2) / 2;
    return {b, t, (t - b) / 4};
  };
  if (shared_axis) {
    std::fill(top_value.begin(), top_value.end(), *std::max_element(top_value.begin(), top_value.end()));
    std::fill(bottom_value.begin(), bottom_value.end(), *std::min_element(bottom_value.begin(), bottom_value.end()));
  }
  const std::size_t columns = std::min<std::size_t>(3, panels.size());
  const std::size_t rows = (panels.size() + columns - 1) / columns;
  const double panel_w = panels.size() == 1 ? 620 : 300, panel_h = panels.size() == 1 ? 260 : 190, left = 44, right = 12, above = 22, below = 34, head = 50;
  // The legend: one under all panels when each draws the same series, else one under each panel,
  // of the series it draws, so that no entry stands under a panel that does not draw it. Entries
  // in columns as wide as the longest name needs.
  const bool one_legend = std::all_of(drawn.begin(), drawn.end(), [&](const auto& d) { return d == drawn[0]; });
  const double legend_row = 16;
  const auto legend_columns = [&](const std::vector<std::size_t>& entries, double room) {
    double longest = 0;
    for (std::size_t c : entries) longest = std::max(longest, 6.5 * double(series[c].size()));  // 11 px, by bytes: generous
    return std::max<std::size_t>(1, std::size_t(room / std::min(room, 34 + longest)));
  };
  const auto legend_height = [&](const std::vector<std::size_t>& entries, double room) {
    const std::size_t per_row = legend_columns(entries, room);
    return legend_row * double((entries.size() + per_row - 1) / per_row) + 8;
  };
  // Each row of panels, with the legends under it: where it starts, and the bottom.
  std::vector<double> row_top = {head};
  for (std::size_t r = 0; r < rows; ++r) {
    double legends = 0;
    for (std::size_t p = r * columns; !one_legend && p < std::min(panels.size(), (r + 1) * columns); ++p)
      legends = std::max(legends, legend_height(drawn[p], panel_w));
    row_top.push_back(row_top.back() + panel_h + legends);
  }
  const double width = panel_w * double(columns) + 10;
  const double height = row_top.back() + (one_legend ? legend_height(drawn[0], width - 10) : 0);
  const double plot_w = panel_w - left - right, plot_h = panel_h - above - below;
  const double x_max = std::log10(double(last_step) + 1);

  std::string s = svg_open(width, height);
  s += fmt::format("<text x=\"8\" y=\"18\" font-size=\"13\" font-weight=\"bold\">{}</text>\n", escape_xml(title));
  s += fmt::format("<text x=\"8\" y=\"34\" fill=\"#555\">{}</text>\n", escape_xml(subtitle));
  for (std::size_t p = 0; p < panels.size(); ++p) {
    const double x0 = double(p % columns) * panel_w + left, y0 = row_top[p / columns] + above;
    const auto x = [&](std::size_t step) { return x0 + plot_w * std::log10(double(step) + 1) / x_max; };
    const Axis a = axis(bottom_value[p], top_value[p]);
    const double y_max = a.top, y_min = a.bottom, every = a.every;
    const auto y = [&](double v) { return y0 + plot_h * (1 - std::clamp((v - y_min) / (y_max - y_min), 0.0, 1.0)); };
    if (!panels[p].empty())
      s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-weight=\"bold\">{}</text>\n", x0, y0 - 8, escape_xml(panels[p]));
    s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" stroke=\"#999\"/>\n", x0,
                     y0, plot_w, plot_h);
    for (double v = y_min; v <= y_max + 1e-9 * std::max(1.0, y_max); v += every) {
      const std::string label = log_values        ? (v == 0 ? std::string("1") : fmt::format("1e{:.0f}", v))
                                : every >= 10 && std::abs(v) < 1e6 ? fmt::format("{:.0f}", v)  // 4000, not 4e+03
                                                                    : fmt::format("{:.3g}", v);
      s += fmt::format("<line x1=\"{0:.1f}\" x2=\"{1:.1f}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"#eee\"/>\n", x0, x0 + plot_w, y(v));
      s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" fill=\"#555\">{}</text>\n", x0 - 4, y(v) + 4, label);
    }
    std::vector<std::size_t> ticks = {0};
    for (std::size_t t = 10; t <= last_step; t *= 10) {
      ticks.push_back(t);
      if (t > last_step / 10) break;  // the next power would pass it (or wrap)
    }
    // The last step too, where its label clears the one before it (6.5 px a digit, centred).
    const auto digits = [](std::size_t t) { return double(fmt::format("{}", t).size()); };
    if (last_step > ticks.back() && x(last_step) - x(ticks.back()) >= 6.5 * (digits(last_step) + digits(ticks.back())) / 2 + 6)
      ticks.push_back(last_step);
    for (std::size_t t : ticks)
      s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#555\">{}</text>\n", x(t),
                       y0 + plot_h + 14, t);
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#555\">steps (log scale)</text>\n",
                     x0 + plot_w / 2, y0 + plot_h + 28);
    for (const ChartLine& line : lines) {
      if (line.panel != panels[p]) continue;
      const std::size_t c = std::size_t(std::find(series.begin(), series.end(), line.series) - series.begin());
      const char* colour = colour_of(c);
      std::string band_top, band_bottom, mean;
      for (const auto& [step, all] : line.values) {
        std::vector<double> values;
        for (double v : all)
          if (std::isfinite(v)) values.push_back(v);
        if (values.empty()) continue;
        const auto [lo, hi] = std::minmax_element(values.begin(), values.end());
        band_top += fmt::format("{:.1f},{:.1f} ", x(step), y(*hi));
        band_bottom = fmt::format("{:.1f},{:.1f} ", x(step), y(*lo)) + band_bottom;
        mean += fmt::format("{:.1f},{:.1f} ", x(step), y(stats(values).mean));
      }
      s += fmt::format("<polygon points=\"{}{}\" fill=\"{}\" fill-opacity=\"0.15\" stroke=\"none\"/>\n", band_top, band_bottom,
                       colour);
      s += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.6\"><title>{}</title></polyline>\n",
                       mean, colour, escape_xml((line.panel.empty() ? "" : line.panel + " / ") + line.series));
    }
  }
  // A legend's entries, from (x, y) in a room `room` wide, row by row.
  const auto legend = [&](const std::vector<std::size_t>& entries, double x, double y, double room) {
    const std::size_t per_row = legend_columns(entries, room);
    const double entry_w = room / double(per_row);
    for (std::size_t k = 0; k < entries.size(); ++k) {
      const std::size_t c = entries[k];
      const double lx = x + entry_w * double(k % per_row), ly = y + legend_row * double(k / per_row);
      s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"18\" height=\"4\" fill=\"{}\"/>\n", lx, ly + 4,
                       colour_of(c));
      s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n", lx + 24, ly + 10, escape_xml(series[c]));
    }
  };
  if (one_legend)
    legend(drawn[0], 10, row_top.back(), width - 10);
  else
    for (std::size_t p = 0; p < panels.size(); ++p)
      legend(drawn[p], double(p % columns) * panel_w + 10, row_top[p / columns] + panel_h, panel_w - 10);
  return s + "</svg>\n";
}

}  // namespace qkv::report
