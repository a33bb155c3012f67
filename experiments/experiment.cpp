#include "qkv/experiments/experiment.hpp"

#include <algorithm>
#include <filesystem>
#include <ostream>
#include <sstream>

#include <fmt/format.h>

#include "qkv/core/autograd.hpp"
#include "qkv/core/ops.hpp"
#include "qkv/report/charts.hpp"
#include "qkv/tasks/find_spec.hpp"
#include "qkv/analysis/inspect.hpp"
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
  if (c.proj == nn::Projection::identity) return "identity";
  if (c.proj == nn::Projection::frozen) return "frozen";
  return nn::name_of(c.qk);  // untied, tied or symmetric
}

std::string mean_sd(const std::vector<double>& v, const char* format) {
  const Stats s = stats(v);
  if (s.n == 0) return "-";
  const std::string mean = fmt::format(fmt::runtime(format), s.mean);
  return s.n == 1 ? mean : mean + " ± " + fmt::format(fmt::runtime(format), s.sd);
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

std::string experiment_table(const std::string& name, const Json& runs) {
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
  header.insert(header.end(), {"steps to target", "σ init", "σ", "asymmetry init", "asymmetry"});
  // The experiment's own columns, then those of each task's probe.
  std::vector<Column> extras = experiment_spec(name).columns;
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
    if (short_budget) cells.push_back(mean_sd(curve_values(g, report_step, "accuracy"), "{:.3f}"));
    cells.push_back(mean_sd(run_values(g, "accuracy"), "{:.3f}"));
    const std::vector<double> reached = run_values(g, "steps_to_target");
    cells.push_back(reached.empty() ? fmt::format("not reached (0/{})", g.runs.size())
                                    : fmt::format("{} ({}/{})", mean_sd(reached, "{:.0f}"), reached.size(), g.runs.size()));
    cells.push_back(mean_sd(run_values(g, "sigma_init"), "{:.3f}"));
    cells.push_back(mean_sd(run_values(g, "sigma"), "{:.3f}"));
    cells.push_back(mean_sd(run_values(g, "score_asymmetry_init"), "{:.3f}"));
    cells.push_back(mean_sd(run_values(g, "score_asymmetry"), "{:.3f}"));
    for (const Column& x : extras) cells.push_back(mean_sd(run_values(g, x.key.c_str()), x.format.c_str()));
    out += "| " + fmt::format("{}", fmt::join(cells, " | ")) + " |\n";
  }
  return out;
}

std::vector<std::string> experiment_names() { return names_of(experiment_registry()); }

const ExperimentSpec& experiment_spec(const std::string& name) {
  return find_spec(experiment_registry(), name, "experiment");
}

TrainOptions experiment_run(const std::string& task, const ExperimentOptions& e, std::size_t n) {
  TrainOptions o = default_options(task, n);
  o.steps = e.steps ? e.steps : e.quick ? quick_steps : full_steps;
  o.warmup = std::min<std::size_t>(o.warmup, o.steps / 10 + 1);
  o.eval_batches = e.eval_batches;
  o.target = task_spec(task).target;
  o.target_every = e.quick ? 25 : 50;
  o.checkpoint_every = o.steps;  // at the end only
  o.log_every = std::max<std::size_t>(1, o.steps / 10);
  return o;
}

void set_variant(TrainOptions& o, const std::string& variant) {
  // A QK name (untied, tied, symmetric) with learned projections, or a projection (frozen, identity).
  o.model.qk = nn::from_name(nn::all_qk, variant).value_or(nn::QK::untied);
  o.model.proj = nn::from_name(nn::all_projections, variant).value_or(nn::Projection::learned);
}

ExperimentResult run_experiment(const ExperimentOptions& e, std::ostream& progress, bool tty) {
  const ExperimentSpec& spec = experiment_spec(e.name);
  const std::vector<ExperimentConfig> configs = spec.plan(e);
  const std::size_t seeds = e.seeds ? e.seeds : e.quick ? 1 : full_seeds;
  const std::string out = e.out.empty() ? "runs/experiment-" + e.name : e.out;
  std::error_code error;
  const bool has_runs = std::filesystem::exists(out + "/runs", error) && !std::filesystem::is_empty(out + "/runs", error);
  if (!e.force && (std::filesystem::exists(out + "/results.json", error) || has_runs))
    throw UsageError(fmt::format("--out {}: holds an experiment's results already; give --force to replace them", out));
  // Replaced: the old results go before the first run does, so that none outlives the runs it told of.
  for (const char* file : {"results.json", "table.md"}) std::filesystem::remove(out + "/" + file, error);
  std::filesystem::remove_all(out + "/results", error);
  std::filesystem::create_directories(out + "/runs");
  std::filesystem::create_directories(out + "/results");

  // Every configuration for every seed, as the runs of a sweep: in this process (jobs 1) or in
  // `jobs` processes, each run's numbers the same.
  std::vector<sweep::Run> runs;
  for (std::uint64_t seed = e.seed_start; seed < e.seed_start + seeds; ++seed)
    for (std::size_t c = 0; c < configs.size(); ++c) {
      TrainOptions o = configs[c].options;
      o.seed = seed;
      runs.push_back({.id = fmt::format("{:02}-seed{}", c, seed),
                      .task = o.task,
                      .options = configs[c].labels,
                      .seed = seed,
                      .train = o,
                      .label = fmt::format("{}, seed {}", label_text(configs[c].labels), seed)});
    }
  progress << fmt::format("{}: {} runs, {} at once\n", e.name, runs.size(), e.jobs) << std::flush;
  try {
    sweep::run_runs(runs,
                    {.out = out,
                     .jobs = e.jobs,
                     .extras = {.at_init = spec.at_init, .at_end = spec.at_end},
                     .stop_on_failure = true,
                     .show_training = tty},
                    progress);
  } catch (const Interrupted& stopped) {
    throw Interrupted(stopped.signal, fmt::format("interrupted: the experiment in {} wrote no results; run it again with "
                                                  "--force",
                                                  out));
  }

  ExperimentResult result;
  result.runs = Json::array();
  std::vector<std::optional<Json>> measurements;
  for (const sweep::Run& r : runs) measurements.push_back(sweep::result_of(out, r));
  for (std::size_t i = 0; i < runs.size(); ++i)  // the run that failed, rather than one it left undone
    if (measurements[i] && (*measurements[i])["status"] != "ok")
      throw std::runtime_error(fmt::format("{}/runs/{} ({}): {}", out, runs[i].id, runs[i].label,
                                           (*measurements[i])["error"].get<std::string>()));
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const sweep::Run& r = runs[i];
    const std::optional<Json>& measured = measurements[i];
    if (!measured) throw std::runtime_error(fmt::format("{}/runs/{} ({}): no result", out, r.id, r.label));
    const ExperimentConfig& config = configs[i % configs.size()];
    Json run = {{"experiment", e.name},
                {"task", r.task},
                {"variant", variant_of(r.train.model)},
                {"embeddings", r.train.model.frozen_embeddings ? "frozen" : "learned"},
                {"seed", r.seed},
                {"labels", config.labels}};
    const std::vector<std::string>& head = sweep::result_head_keys();
    for (const auto& [key, value] : measured->items())  // what the run measured, in its order
      if (std::find(head.begin(), head.end(), key) == head.end()) run[key] = value;
    for (const Json& violation : (*measured)["violations"])
      result.warnings.push_back(fmt::format("{}, {}", r.label, violation.get<std::string>()));
    result.runs.push_back(std::move(run));
  }
  result.table = experiment_table(e.name, result.runs);
  for (const std::string& w : result.warnings) result.table += "\nWARNING: " + w + "\n";
  result.chart = accuracy_chart(e.name, result.runs);
  for (const auto& [key, what] : {std::pair<std::string, std::string>{"accuracy", "held-out accuracy"},
                                  {"score_asymmetry", "the readout head's softmax-invariant score asymmetry"}})
    if (std::string chart = curves_chart(e.name, result.runs, key, what); !chart.empty())
      result.curves.emplace_back(key, std::move(chart));
  const std::size_t steps = configs.empty() ? 0 : configs[0].options.steps;  // every run's (experiment_run)
  const Json file = {{"experiment", e.name}, {"quick", e.quick}, {"seed_start", e.seed_start}, {"seeds", seeds},
                     {"steps", steps}, {"curve_steps", curve_steps(steps)}, {"runs", result.runs}};
  const auto write = [&](const std::string& path, const std::string& text) {
    nn::write_atomically(path, text);
    result.files.push_back(path);
  };
  write(out + "/results.json", file.dump(1) + "\n");
  write(out + "/table.md", result.table);
  write(out + "/" + e.name + ".svg", result.chart);
  for (const auto& [key, chart] : result.curves) write(fmt::format("{}/{}-{}.svg", out, e.name, key), chart);
  return result;
}

}  // namespace qkv::experiments
