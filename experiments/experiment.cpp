#include "qkv/experiments/experiment.hpp"

#include <algorithm>
#include <filesystem>
#include <ostream>
#include <sstream>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "qkv/core/autograd.hpp"
#include "qkv/core/ops.hpp"
#include "qkv/report/charts.hpp"
#include "qkv/report/statistics.hpp"
#include "qkv/experiments/detail/shipped_files.hpp"
#include "qkv/sweep/measurements.hpp"
#include "qkv/sweep/sweep.hpp"
#include "qkv/tasks/find_spec.hpp"
#include "qkv/analysis/inspect.hpp"
#include "qkv/training/options.hpp"
#include "qkv/training/trainer.hpp"
#include "qkv/nn/circuits.hpp"
#include "qkv/nn/safetensors.hpp"
#include "qkv/tasks/evaluate.hpp"
#include "qkv/training/run_folder.hpp"

namespace qkv::experiments {

using namespace analysis;
using namespace report;
using namespace tasks;
using namespace training;

namespace {

using Json = nlohmann::ordered_json;

std::string variant_of(const nn::TransformerConfig& c) {
  if (c.proj != nn::Projection::learned) return nn::name_of(c.proj);  // frozen, identity, identity-qk
  return nn::name_of(c.qk);  // untied, tied or symmetric
}

// "0.471 ± 0.284 (0.371–0.574)": the mean ± the sample sd over seeds, and the 95% bootstrap interval
// of the mean where it is not the mean itself at this precision.
std::string mean_cell(const std::vector<double>& v, const char* format) {
  const Stats s = stats(v);
  if (s.n == 0) return "-";
  const auto f = [&](double x) { return fmt::format(fmt::runtime(format), x); };
  if (s.n == 1) return f(s.mean);
  const auto [lo, hi] = bootstrap_mean_interval(v);
  const std::string cell = f(s.mean) + " ± " + f(s.sd);
  return f(lo) == f(s.mean) && f(hi) == f(s.mean) ? cell : fmt::format("{} ({}–{})", cell, f(lo), f(hi));
}

// `key` at `step` of each run's curve.
std::vector<double> curve_values(const RunGroup& g, std::size_t step, const char* key) {
  std::vector<double> v;
  for (const auto* r : g.runs)
    for (const Json& point : r->value("curve", Json::array()))
      if (point.at("step") == step && point.contains(key) && !point.at(key).is_null()) v.push_back(point.at(key).get<double>());
  return v;
}

}  // namespace

std::string experiment_table(const std::vector<std::string>& measure, const Json& runs) {
  const std::vector<RunGroup> groups = group_runs(runs);
  if (groups.empty()) return "";
  std::vector<std::string> header;
  for (const auto& [key, value] : groups[0].labels.items()) header.push_back(key);
  // Accuracy at step report_step too, when the runs went past it; then at the end.
  const std::size_t steps = runs[0].at("steps");
  const bool same_steps = std::all_of(runs.begin(), runs.end(), [&](const Json& r) { return r.at("steps") == steps; });
  const bool short_budget = same_steps && steps > report_step;
  if (short_budget) header.push_back(fmt::format("accuracy at step {}", report_step));
  header.push_back(same_steps ? fmt::format("accuracy at step {}", steps) : std::string("accuracy at the end"));
  header.insert(header.end(), {"reached target", "steps to target", "σ init", "σ", "asymmetry init", "asymmetry"});
  // The experiment's own columns, then those of each task's probe.
  std::vector<Column> extras;
  for (const std::string& m : measure)
    for (const Column& c : sweep::measurement(m).columns) extras.push_back(c);
  std::vector<std::string> tasks;
  for (const Json& run : runs)
    if (std::find(tasks.begin(), tasks.end(), run["task"]) == tasks.end()) tasks.push_back(run["task"]);
  for (const std::string& task : tasks)
    for (const Column& x : task_spec(task).probe_columns)  // once per key: tasks share some
      if (std::none_of(extras.begin(), extras.end(), [&](const Column& e) { return e.key == x.key; })) extras.push_back(x);
  for (const Column& x : extras) header.push_back(x.header);
  std::string out = "| " + fmt::format("{}", fmt::join(header, " | ")) + " |\n|";
  for (std::size_t i = 0; i < header.size(); ++i) out += "---|";
  out += "\n";
  for (const RunGroup& g : groups) {
    std::vector<std::string> cells;
    for (const auto& [key, value] : g.labels.items())
      cells.push_back(value.is_string() ? value.get<std::string>() : value.dump());
    if (short_budget) cells.push_back(mean_cell(curve_values(g, report_step, "accuracy"), "{:.3f}"));
    cells.push_back(mean_cell(run_values(g, "accuracy"), "{:.3f}"));
    // k of n (95% Wilson interval); the steps of those that reached it as median (min–max).
    const std::vector<double> reached = run_values(g, "steps_to_target");
    const auto [lo, hi] = wilson_interval(reached.size(), g.runs.size());
    cells.push_back(fmt::format("{} of {} ({:.0f}–{:.0f}%)", reached.size(), g.runs.size(), 100 * lo, 100 * hi));
    const auto [fastest, slowest] = std::minmax_element(reached.begin(), reached.end());
    cells.push_back(reached.empty()       ? std::string("-")
                    : reached.size() == 1 ? fmt::format("{:.0f}", reached[0])
                                          : fmt::format("{:.0f} ({:.0f}–{:.0f})", median(reached), *fastest, *slowest));
    for (const char* key : {"sigma_init", "sigma", "score_asymmetry_init", "score_asymmetry"})
      cells.push_back(mean_cell(run_values(g, key), "{:.3f}"));
    for (const Column& x : extras) cells.push_back(mean_cell(run_values(g, x.key.c_str()), x.format.c_str()));
    out += "| " + fmt::format("{}", fmt::join(cells, " | ")) + " |\n";
  }
  return out;
}

namespace {

struct Shipped {
  std::string name, text, description;
};

const std::vector<Shipped>& shipped() {
  static const std::vector<Shipped> files = [] {
    std::vector<Shipped> out;
    for (std::size_t i = 0; i < detail::shipped_file_count; ++i) {
      const auto& [name, text] = detail::shipped_files[i];
      out.push_back({name, text, Json::parse(text).value("description", "")});
    }
    return out;
  }();
  return files;
}

// The experiment's name: a shipped one's, or a file's name without its folder and .json.
std::string name_of(const std::string& name_or_path) {
  if (!name_or_path.ends_with(".json")) return name_or_path;
  return std::filesystem::path(name_or_path).stem().string();
}

}  // namespace

std::vector<std::string> experiment_names() { return names_of(shipped()); }

const std::string& experiment_file(const std::string& name) { return find_spec(shipped(), name, "experiment").text; }

std::string experiment_description(const std::string& name) { return find_spec(shipped(), name, "experiment").description; }

std::string experiment_table(const std::string& name, const Json& runs) {
  const Json spec = Json::parse(experiment_file(name));
  return experiment_table(spec.value("measure", std::vector<std::string>{}), runs);
}

Json experiment_sweep(const ExperimentOptions& e) {
  Json spec;
  if (e.name.ends_with(".json")) {
    spec = sweep::read_sweep_file(e.name);
    if (!spec.is_object()) throw std::invalid_argument(fmt::format("{}: a sweep is one JSON object", e.name));
  } else {
    spec = Json::parse(experiment_file(e.name));
  }
  const std::size_t steps = e.quick && !e.steps ? quick_steps : e.steps;
  if (steps) {
    if (!spec.contains("fixed")) spec["fixed"] = Json::object();
    Json& fixed = spec["fixed"];
    if (!fixed.is_object()) return spec;  // refused as it is, by parse_sweep
    // A grid of budgets (scale's) gives way to the one asked for.
    if (spec.contains("grid") && spec["grid"].is_object()) spec["grid"].erase("steps");
    fixed["steps"] = steps;
    // A shorter budget than the default warmup's tenfold keeps the warmup to a tenth of the steps.
    const std::size_t warmup = tasks::TrainOptions{}.warmup;
    if (!fixed.contains("warmup") && steps / 10 + 1 < warmup) fixed["warmup"] = steps / 10 + 1;
  }
  if (e.quick || e.seeds || e.seed_start) {
    if (!spec.contains("seeds")) spec["seeds"] = Json::object();
    if (!spec["seeds"].is_object()) return spec;  // refused as it is, by parse_sweep
    if (e.seeds || e.quick) spec["seeds"]["count"] = e.seeds ? e.seeds : 1;
    if (e.seed_start) spec["seeds"]["start"] = *e.seed_start;
  }
  return spec;
}

std::pair<std::string, std::vector<std::pair<std::string, std::string>>> experiment_charts(const std::string& name,
                                                                                           const Json& runs) {
  std::vector<std::pair<std::string, std::string>> curves;
  for (const auto& [key, what] : {std::pair<std::string, std::string>{"accuracy", "held-out accuracy"},
                                  {"score_asymmetry", "the readout head's softmax-invariant score asymmetry"}})
    if (std::string chart = curves_chart(name, runs, key, what); !chart.empty()) curves.emplace_back(key, std::move(chart));
  return {accuracy_chart(name, runs), std::move(curves)};
}

ExperimentResult run_experiment(const ExperimentOptions& e, std::ostream& progress, bool tty) {
  const std::string name = name_of(e.name);
  const Json spec = experiment_sweep(e);
  sweep::Sweep plan = sweep::parse_sweep(spec, e.name.ends_with(".json") ? e.name : "experiment " + e.name);
  const std::string out = e.out.empty() ? "runs/experiment-" + name : e.out;
  std::error_code error;
  const bool has_runs = std::filesystem::exists(out + "/runs", error) && !std::filesystem::is_empty(out + "/runs", error);
  if (e.resume) {
    if (e.force) throw UsageError("--resume: goes on with the runs in --out; --force replaces them: give one");
    std::optional<Json> before;
    try {
      before = Json::parse(nn::read_file(out + "/sweep.json", 1 << 20));
    } catch (const std::exception&) {
      throw UsageError(fmt::format("--resume: {} holds no experiment to go on with (no sweep.json)", out));
    }
    if (*before != spec)
      throw UsageError(fmt::format("--resume: {}/sweep.json is another sweep than experiment {}'s with these options; "
                                   "give --force to replace it",
                                   out, name));
  } else if (!e.force && (std::filesystem::exists(out + "/results.json", error) || has_runs)) {
    throw UsageError(fmt::format("--out {}: holds an experiment's results already; give --force to replace them (or "
                                 "--resume to go on with it)",
                                 out));
  }
  // Replaced: the old results go before the first run does, so that none outlives the runs it told of.
  for (const char* file : {"results.json", "table.md", "results.jsonl", "results.csv", "summary.md"})
    std::filesystem::remove(out + "/" + file, error);
  if (!e.resume) std::filesystem::remove_all(out + "/results", error);
  std::filesystem::create_directories(out + "/runs");
  std::filesystem::create_directories(out + "/results");
  nn::write_atomically(out + "/sweep.json", spec.dump(2) + "\n");  // the sweep it runs, for `qkv sweep` to run again

  for (sweep::Run& r : plan.runs) r.label = fmt::format("{}, seed {}", label_text(r.labels), r.seed);
  progress << fmt::format("{}: {} runs, {} at once\n", name, plan.runs.size(), e.jobs) << std::flush;
  try {
    sweep::run_workers(plan, {.out = out, .jobs = e.jobs, .stop_on_failure = true, .show_training = tty}, progress);
  } catch (const Interrupted& stopped) {
    throw Interrupted(stopped.signal, fmt::format("interrupted: the experiment in {} wrote no results; go on with it "
                                                  "with --resume (its finished runs stay), or run it again with --force",
                                                  out));
  }

  // Seed by seed, each seed's runs in the file's order.
  std::vector<std::size_t> order(plan.runs.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return plan.runs[a].seed < plan.runs[b].seed; });
  std::vector<std::optional<Json>> measurements;
  for (const std::size_t i : order) measurements.push_back(sweep::result_of(out, plan.runs[i]));
  for (std::size_t k = 0; k < order.size(); ++k)  // the run that failed, rather than one it left undone
    if (measurements[k] && (*measurements[k])["status"] != "ok")
      throw std::runtime_error(fmt::format("{}/runs/{} ({}): {}", out, plan.runs[order[k]].id, plan.runs[order[k]].label,
                                           (*measurements[k])["error"].get<std::string>()));
  ExperimentResult result;
  result.runs = Json::array();
  for (std::size_t k = 0; k < order.size(); ++k) {
    const sweep::Run& r = plan.runs[order[k]];
    const std::optional<Json>& measured = measurements[k];
    if (!measured) throw std::runtime_error(fmt::format("{}/runs/{} ({}): no result", out, r.id, r.label));
    Json run = {{"experiment", name},
                {"task", r.task},
                {"variant", variant_of(r.train.model)},
                {"embeddings", r.train.model.frozen_embeddings ? "frozen" : "learned"},
                {"seed", r.seed},
                {"labels", r.labels}};
    const std::vector<std::string>& head = sweep::result_head_keys();
    for (const auto& [key, value] : measured->items())  // what the run measured, in its order
      if (std::find(head.begin(), head.end(), key) == head.end()) run[key] = value;
    for (const Json& violation : (*measured)["violations"])
      result.warnings.push_back(fmt::format("{}, {}", r.label, violation.get<std::string>()));
    result.runs.push_back(std::move(run));
  }
  sweep::collect(plan, out, false);  // results.jsonl, results.csv and summary.md, as `qkv sweep` writes them
  result.table = experiment_table(plan.measurements, result.runs);
  for (const std::string& w : result.warnings) result.table += "\nWARNING: " + w + "\n";
  std::tie(result.chart, result.curves) = experiment_charts(name, result.runs);
  const std::size_t steps = plan.runs.empty() ? 0 : plan.runs[0].train.steps;
  const Json seeds = spec.value("seeds", Json::object());
  const Json file = {{"experiment", name},
                     {"quick", e.quick},
                     {"seed_start", seeds.value("start", std::uint64_t(0))},
                     {"seeds", seeds.value("count", std::uint64_t(1))},
                     {"steps", steps},
                     {"curve_steps", sweep::curve_steps(steps)},
                     {"runs", result.runs}};
  const auto write = [&](const std::string& path, const std::string& text) {
    nn::write_atomically(path, text);
    result.files.push_back(path);
  };
  write(out + "/results.json", file.dump(1) + "\n");
  write(out + "/table.md", result.table);
  write(out + "/" + name + ".svg", result.chart);
  for (const auto& [key, chart] : result.curves) write(fmt::format("{}/{}-{}.svg", out, name, key), chart);
  for (const char* collected : {"results.jsonl", "results.csv", "summary.md"}) result.files.push_back(out + "/" + collected);
  return result;
}

}  // namespace qkv::experiments
