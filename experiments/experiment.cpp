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

// σ of the head the task reads: head 0 of the last layer.
double readout_sigma(const nn::Transformer& m) { return nn::symmetric_share(nn::qk_circuit(m.blocks.back()->attn, 0)); }

// Unpadded held-out sequences, one at a time.
std::vector<std::vector<std::int64_t>> held_out_sequences(const Task& task, std::size_t n, std::uint64_t seed) {
  Generator gen(seed ^ 0x5eedf00dULL);
  std::vector<std::vector<std::int64_t>> out;
  for (std::size_t i = 0; i < n; ++i) {
    const Batch b = task.sample(1, gen);
    out.push_back(task.encode(task.decode(std::vector<std::int64_t>(b.tokens.begin(), b.tokens.end()))));
  }
  return out;
}

// The readout head's softmax-invariant score asymmetry, averaged over the inputs that have one; null
// when none has (a causal model).
Json readout_score_asymmetry(const nn::Transformer& m, const std::vector<std::vector<std::int64_t>>& inputs) {
  double total = 0, n = 0;
  for (const auto& input : inputs)
    if (const std::optional<double> a = score_asymmetries(m, input).back()[0]) total += *a, ++n;
  return n > 0 ? Json(total / n) : Json(nullptr);
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

std::vector<std::size_t> curve_steps(std::size_t steps) {
  std::vector<std::size_t> out = {0};
  for (std::size_t decade = 10; decade < steps; decade *= 10)
    for (const std::size_t m : {1, 2, 3, 5})
      if (m * decade < steps) out.push_back(m * decade);
  if (steps > 0) out.push_back(steps);
  return out;
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
  std::filesystem::create_directories(out + "/runs");
  std::ostringstream quiet;
  ExperimentResult result;
  result.runs = Json::array();
  const std::size_t total = configs.size() * seeds;
  std::size_t done = 0;
  for (std::uint64_t seed = e.seed_start; seed < e.seed_start + seeds; ++seed)
    for (std::size_t c = 0; c < configs.size(); ++c) {
      const ExperimentConfig& config = configs[c];
      TrainOptions o = config.options;
      o.seed = seed;
      o.out = fmt::format("{}/runs/{:02}-seed{}", out, c, seed);
      o.force = true;  // the experiment's own runs: a rerun replaces them
      const auto task = make_task(o.task, o.n);
      const auto sequences = held_out_sequences(*task, 16, seed);
      const TaskSpec& task_info = task_spec(o.task);
      Json run = {{"experiment", e.name},
                  {"task", o.task},
                  {"variant", variant_of(o.model)},
                  {"embeddings", o.model.frozen_embeddings ? "frozen" : "learned"},
                  {"seed", seed},
                  {"labels", config.labels}};
      if (spec.at_init) {
        Generator gen(o.seed);  // the same init as train()'s
        nn::Transformer init(o.model, gen);
        spec.at_init(run, init, *task, sequences, seed);
      }
      // The curve: accuracy (on the final evaluation's held-out sequences), σ, asymmetry and the
      // task's probe at log-spaced steps, from the init (step 0) to the end.
      const std::vector<std::size_t> at = curve_steps(o.steps);
      Json curve = Json::array();
      std::vector<std::string> violations;
      const auto observe = [&](std::size_t step, const nn::Transformer& model) {
        if (!std::binary_search(at.begin(), at.end(), step)) return;
        Json point = {{"step", step},
                      {"accuracy", evaluate(model, *task, o.eval_batches, o.batch, o.seed, o.mask_padding).accuracy},
                      {"sigma", readout_sigma(model)},
                      {"score_asymmetry", readout_score_asymmetry(model, sequences)}};
        if (task_info.probe) {
          const Probe probe = task_info.probe(model, seed);
          for (const auto& [key, value] : probe.values) point[key] = value;
          for (const std::string& v : probe.violations) violations.push_back(fmt::format("at step {}: {}", step, v));
        }
        curve.push_back(std::move(point));
      };
      progress << fmt::format("[{:>3}/{}] {}, seed {}", done + 1, total, label_text(config.labels), seed)
               << (tty ? "\n" : "") << std::flush;
      TrainResult r;
      try {
        r = train(o, tty ? progress : quiet, tty, observe);
      } catch (const Interrupted& stopped) {
        throw Interrupted(stopped.signal, fmt::format("interrupted in the run in {}: the experiment wrote no results; "
                                                      "run it again with --force",
                                                      o.out));
      }
      if (curve.empty() || curve.front()["step"] != 0 || curve.back()["step"] != r.steps)
        throw std::logic_error(fmt::format("{}: the run's curve does not run from step 0 to step {}", o.out, r.steps));
      const Json& first = curve.front();
      const Json& last = curve.back();
      run["accuracy"] = r.eval.accuracy;
      run["steps_to_target"] = r.steps_to_target ? Json(*r.steps_to_target) : Json(nullptr);
      run["target"] = o.target;
      run["steps"] = r.steps;
      run["seconds"] = r.seconds;
      run["sigma_init"] = first["sigma"];
      run["sigma"] = last["sigma"];
      run["score_asymmetry_init"] = first["score_asymmetry"];
      run["score_asymmetry"] = last["score_asymmetry"];
      if (spec.at_end) spec.at_end(run, *load_model(o.out), sequences);
      for (const auto& [key, value] : last.items())  // the probe's values at the end
        if (!run.contains(key) && key != "step") run[key] = value;
      run["curve"] = std::move(curve);
      run["config"] = Json::parse(nn::read_file(o.out + "/config.json", 1 << 20));  // as train recorded it
      progress << fmt::format("{}: accuracy {:.4f}, {}, {:.1f} s\n", tty ? "  done" : "", r.eval.accuracy,
                              r.steps_to_target ? fmt::format("target at step {}", *r.steps_to_target)
                                                : std::string("target not reached"),
                              r.seconds)
               << std::flush;
      for (const std::string& violation : violations)
        result.warnings.push_back(fmt::format("{}, seed {}, {}", label_text(config.labels), seed, violation));
      result.runs.push_back(std::move(run));
      ++done;
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
