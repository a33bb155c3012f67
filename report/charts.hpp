#pragma once
// Charts as SVG: the numbers of `qkv experiment` runs gathered per configuration, and drawn (final
// accuracy as bars, any measurement along training as curves over log-spaced steps); and lines
// over training steps, which `qkv inspect` draws from a run's metrics and snapshots.
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/report/statistics.hpp"

namespace qkv::report {

// The runs of one configuration (the same labels), in the order the runs first name them.
struct RunGroup {
  nlohmann::ordered_json labels;
  std::vector<const nlohmann::ordered_json*> runs;
};
std::vector<RunGroup> group_runs(const nlohmann::ordered_json& runs);
// The value at `path` of a run: a key, or keys joined by dots into nested objects and lists
// ("ablation.L0H0.zero", "ablation.needed_by_layer.0"); none when a key or index is missing.
const nlohmann::ordered_json* value_at(const nlohmann::ordered_json& run, const std::string& path);
// The value at `key` (a path, as value_at's) in each run of the group that has one (a number or a
// boolean, as 1 or 0; not null).
std::vector<double> run_values(const RunGroup& group, const char* key);

// "brackets / causal / tied": the labels' values.
std::string label_text(const nlohmann::ordered_json& labels);

// Horizontal bars of mean final accuracy with ±1 std whiskers and every seed as a dot.
std::string accuracy_chart(const std::string& name, const nlohmann::ordered_json& runs);

// `key` of each run's "curve" (its points {step, key: value}) against the step on a log axis: a
// panel per task, a line per configuration (mean over seeds) with a band from the lowest seed to
// the highest. Null values are left out; "" when no run has one.
std::string curves_chart(const std::string& name, const nlohmann::ordered_json& runs, const std::string& key,
                         const std::string& what);

// A line of a steps chart: its panel (one plot each; "" for a chart of one), its series (a colour
// and a legend entry each), and at each step its values: a line through their mean, in a band
// from the lowest to the highest. A line that stands for many (`many`: the series a panel has
// too many of to name, gathered) is grey.
struct ChartLine {
  std::string panel, series;
  std::map<std::size_t, std::vector<double>> values{};
  bool many = false;
};

// The lines against the step on a log axis, up to three panels a row, with a legend of the series;
// values in [0, 1] on a fixed axis, larger ones up to the next half, past 10 up to a multiple of a
// round step (1, 2, 2.5 or 5 times a power of ten, lines labelled 1000, 2000, …), on one axis for
// all panels when `shared_axis` (the same measure), else each panel's own. Non-finite values are left out.
// With `log_values`, values on a log axis of whole decades (a loss), those not above 0 left out,
// each line through the geometric mean. "" for no lines.
std::string steps_chart(const std::string& title, const std::string& subtitle, const std::vector<ChartLine>& lines,
                        bool shared_axis, bool log_values = false);

}  // namespace qkv::report
