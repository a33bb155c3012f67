#include "qkv/report/across_training.hpp"

#include <algorithm>
#include <cmath>
#include <ostream>

#include <fmt/format.h>

#include "qkv/report/heatmap.hpp"
#include <fmt/ostream.h>

#include "qkv/report/charts.hpp"
#include "qkv/report/patching.hpp"

namespace qkv::report {

using analysis::AcrossTraining;
using analysis::CheckpointMeasures;
using analysis::HeadMeasures;

namespace {

nlohmann::json optional_number(const std::optional<double>& v) { return v ? finite_or_null(*v) : nlohmann::json(); }

std::string optional_text(const std::optional<double>& v, const char* format) {
  return v && std::isfinite(*v) ? fmt::format(fmt::runtime(format), *v) : std::string("-");
}

// Each head's measures, by name, as the table, the JSON and the charts show them.
struct HeadColumn {
  const char* key;
  const char* title;
  std::optional<double> (*value)(const HeadMeasures&);
};
const HeadColumn head_columns[] = {
    {"sigma", "σ", [](const HeadMeasures& h) { return std::optional(h.sigma); }},
    {"previous_token", "previous-token", [](const HeadMeasures& h) { return std::optional(h.detection.previous_token); }},
    {"duplicate_token", "duplicate-token", [](const HeadMeasures& h) { return std::optional(h.detection.duplicate_token); }},
    {"induction", "induction", [](const HeadMeasures& h) { return std::optional(h.detection.induction); }},
    {"prefix_matching", "prefix matching", [](const HeadMeasures& h) { return std::optional(h.prefix_matching); }},
    {"noising_share", "noising share", [](const HeadMeasures& h) { return h.noising_share; }},
    {"logit_attribution", "direct logit attr.", [](const HeadMeasures& h) { return h.logit_attribution; }},
};

}  // namespace

nlohmann::json to_json(const AcrossTraining& a) {
  nlohmann::json checkpoints = nlohmann::json::array();
  for (const CheckpointMeasures& c : a.checkpoints) {
    nlohmann::json heads = nlohmann::json::array();
    for (std::size_t l = 0; l < c.heads.size(); ++l)
      for (std::size_t h = 0; h < c.heads[l].size(); ++h) {
        nlohmann::json j = {{"layer", l}, {"head", h}};
        for (const HeadColumn& column : head_columns) j[column.key] = optional_number(column.value(c.heads[l][h]));
        heads.push_back(std::move(j));
      }
    nlohmann::json composition = nlohmann::json::array();
    for (const analysis::HeadComposition& x : c.composition)
      composition.push_back({{"from", head_label(x.from_layer, x.from_head)},
                             {"to", head_label(x.to_layer, x.to_head)},
                             {"q", x.q},
                             {"k", x.k},
                             {"v", x.v}});
    checkpoints.push_back(
        {{"step", c.step},
         {"loss", c.loss},
         {"accuracy", c.accuracy},
         {"in_context", c.in_context ? nlohmann::json{{"early", c.in_context->early},
                                                      {"late", c.in_context->late},
                                                      {"score", c.in_context->score()}}
                                     : nlohmann::json()},
         {"heads", std::move(heads)},
         {"composition", std::move(composition)}});
  }
  const analysis::Formation f = analysis::formation(a);
  const auto step_or_null = [](const std::optional<std::size_t>& s) { return s ? nlohmann::json(*s) : nlohmann::json(); };
  nlohmann::json formed_heads = nlohmann::json::array(), formed_pairs = nlohmann::json::array();
  for (const auto& h : f.heads)
    formed_heads.push_back({{"head", head_label(h.layer, h.head)},
                            {"role", analysis::head_kind_name(h.role)},
                            {"score", h.score},
                            {"step", step_or_null(h.step)}});
  for (const auto& x : f.composition)
    formed_pairs.push_back({{"from", head_label(x.from_layer, x.from_head)},
                            {"to", head_label(x.to_layer, x.to_head)},
                            {"k_step", step_or_null(x.step)}});
  return {{"task", a.task},
          {"dir", a.dir},
          {"sequences", a.sequences},
          {"seed", a.seed},
          {"checkpoints", std::move(checkpoints)},
          {"half_way", {{"loss", step_or_null(f.loss)}, {"in_context", step_or_null(f.in_context)}, {"heads", formed_heads}, {"composition", formed_pairs}}}};
}

void print_across_training(std::ostream& out, const AcrossTraining& a) {
  fmt::print(out, "{}: {} checkpoints kept along training; measured on {} held-out sequences of {} (seed {})\n\n",
             a.dir.empty() ? a.task : a.dir, a.checkpoints.size(), a.sequences, a.task, a.seed);
  fmt::print(out, "{:>8}{:>10}{:>10}{:>14}{:>12}{:>12}\n", "step", "loss", "accuracy", "in-context", "early loss", "late loss");
  for (const CheckpointMeasures& c : a.checkpoints) {
    const auto ic = c.in_context;
    fmt::print(out, "{:>8}{:>10.4f}{:>10}{:>14}{:>12}{:>12}\n", c.step, c.loss, percent(c.accuracy),
               optional_text(ic ? std::optional(ic->score()) : std::nullopt, "{:+.3f}"),
               optional_text(ic ? std::optional(ic->early) : std::nullopt, "{:.3f}"),
               optional_text(ic ? std::optional(ic->late) : std::nullopt, "{:.3f}"));
  }
  fmt::print(out,
             "in-context: the next-token loss over the last quarter of the positions minus over the first (Olsson et al. "
             "2022); below 0 when the context helps\n");
  if (a.checkpoints.empty()) return;
  const analysis::Formation f = analysis::formation(a);
  const auto step_text = [](const std::optional<std::size_t>& s) { return s ? fmt::format("step {}", *s) : std::string("-"); };
  fmt::print(out, "\nwhen each part formed: the kept step from which on a measure stays past half of the way from its "
                  "first value to its last\n");
  fmt::print(out, "  {:<44}{}\n", "held-out loss", step_text(f.loss));
  if (f.in_context) fmt::print(out, "  {:<44}{}\n", "in-context score", step_text(f.in_context));
  for (const auto& h : f.heads)
    fmt::print(out, "  {:<44}{}\n",
               fmt::format("{} {} score (now {:.3f})", head_label(h.layer, h.head), analysis::head_kind_name(h.role), h.score),
               step_text(h.step));
  for (const auto& x : f.composition)
    fmt::print(out, "  {:<44}{}\n",
               fmt::format("{}→{} K-composition", head_label(x.from_layer, x.from_head), head_label(x.to_layer, x.to_head)),
               step_text(x.step));
  for (std::size_t l = 0; l < a.checkpoints[0].heads.size(); ++l)
    for (std::size_t h = 0; h < a.checkpoints[0].heads[l].size(); ++h) {
      fmt::print(out, "\n{}\n{:>8}", head_label(l, h), "step");
      for (const HeadColumn& column : head_columns) fmt::print(out, "{:>19}", column.title);
      fmt::print(out, "\n");
      for (const CheckpointMeasures& c : a.checkpoints) {
        fmt::print(out, "{:>8}", c.step);
        for (const HeadColumn& column : head_columns) fmt::print(out, "{:>19}", optional_text(column.value(c.heads[l][h]), "{:.3f}"));
        fmt::print(out, "\n");
      }
    }
  if (!a.checkpoints[0].composition.empty()) {
    fmt::print(out, "\ncomposition (K), each earlier head into each later head\n{:>8}", "step");
    for (const auto& x : a.checkpoints[0].composition)
      fmt::print(out, "{:>14}", head_label(x.from_layer, x.from_head) + "→" + head_label(x.to_layer, x.to_head));
    fmt::print(out, "\n");
    for (const CheckpointMeasures& c : a.checkpoints) {
      fmt::print(out, "{:>8}", c.step);
      for (const auto& x : c.composition) fmt::print(out, "{:>14.3f}", x.k);
      fmt::print(out, "\n");
    }
  }
}

std::vector<std::pair<std::string, std::string>> across_training_charts(const AcrossTraining& a) {
  std::vector<ChartLine> run, heads;
  const auto add = [](std::vector<ChartLine>& lines, const std::string& panel, const std::string& series, std::size_t step,
                      const std::optional<double>& v) {
    if (!v || !std::isfinite(*v)) return;
    auto it = std::find_if(lines.begin(), lines.end(), [&](const ChartLine& l) { return l.panel == panel && l.series == series; });
    if (it == lines.end()) it = lines.insert(lines.end(), ChartLine{.panel = panel, .series = series});
    it->values[step].push_back(*v);
  };
  for (const CheckpointMeasures& c : a.checkpoints) {
    add(run, "held-out loss", "held out", c.step, c.loss);
    add(run, "held-out accuracy", "held out", c.step, c.accuracy);
    if (c.in_context) {
      add(run, "next-token loss", "first quarter", c.step, c.in_context->early);
      add(run, "next-token loss", "last quarter", c.step, c.in_context->late);
    }
    for (std::size_t l = 0; l < c.heads.size(); ++l)
      for (std::size_t h = 0; h < c.heads[l].size(); ++h)
        for (const HeadColumn& column : head_columns)
          add(heads, column.title, head_label(l, h), c.step, column.value(c.heads[l][h]));
    for (const analysis::HeadComposition& x : c.composition) {
      const std::string pair = head_label(x.from_layer, x.from_head) + "→" + head_label(x.to_layer, x.to_head);
      add(heads, "composition", pair + " Q", c.step, x.q);
      add(heads, "composition", pair + " K", c.step, x.k);
      add(heads, "composition", pair + " V", c.step, x.v);
    }
  }
  const std::string subtitle = fmt::format("{}: the checkpoints kept along training, on {} held-out sequences",
                                           a.dir.empty() ? a.task : a.dir, a.sequences);
  std::vector<std::pair<std::string, std::string>> charts;
  if (!run.empty()) charts.emplace_back("across-training", steps_chart("loss along training", subtitle, run, false));
  if (!heads.empty()) charts.emplace_back("across-training-heads", steps_chart("the heads along training", subtitle, heads, false));
  return charts;
}

}  // namespace qkv::report
