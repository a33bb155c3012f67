#include "examples/cli/experiment.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <ostream>
#include <sstream>

#include <fmt/format.h>

#include "qkv/core/autograd.hpp"
#include "qkv/core/ops.hpp"
#include "examples/cli/heatmap.hpp"
#include "examples/cli/registry.hpp"
#include "examples/cli/inspect.hpp"
#include "examples/cli/train.hpp"
#include "qkv/nn/circuits.hpp"
#include "qkv/nn/safetensors.hpp"

namespace qkv::cli {

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

struct Stats {
  double mean = 0, sd = 0;
  std::size_t n = 0;
};

Stats stats(const std::vector<double>& v) {
  Stats s;
  s.n = v.size();
  if (v.empty()) return s;
  for (double x : v) s.mean += x;
  s.mean /= double(v.size());
  if (v.size() > 1) {
    for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(s.sd / double(v.size() - 1));
  }
  return s;
}

std::string mean_sd(const std::vector<double>& v, const char* format) {
  const Stats s = stats(v);
  if (s.n == 0) return "-";
  const std::string mean = fmt::format(fmt::runtime(format), s.mean);
  return s.n == 1 ? mean : mean + " ± " + fmt::format(fmt::runtime(format), s.sd);
}

std::string label_text(const Json& labels) {
  std::string out;
  for (const auto& [key, value] : labels.items())
    out += (out.empty() ? "" : " / ") + (value.is_string() ? value.get<std::string>() : value.dump());
  return out;
}

struct Group {
  Json labels;
  std::vector<const Json*> runs;
};

std::vector<Group> groups_of(const Json& runs) {
  std::vector<Group> groups;
  for (const auto& run : runs) {
    const Json& labels = run.at("labels");
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) { return g.labels == labels; });
    if (it == groups.end()) it = groups.insert(groups.end(), Group{labels, {}});
    it->runs.push_back(&run);
  }
  return groups;
}

std::vector<double> column(const Group& g, const char* key) {
  std::vector<double> v;
  for (const auto* r : g.runs)
    if (r->contains(key) && !r->at(key).is_null()) v.push_back(r->at(key).get<double>());
  return v;
}

std::string markdown_table(const std::string& name, const Json& runs) {
  const std::vector<Group> groups = groups_of(runs);
  if (groups.empty()) return "";
  std::vector<std::string> header;
  for (const auto& [key, value] : groups[0].labels.items()) header.push_back(key);
  header.insert(header.end(), {"accuracy", "steps to target", "σ init", "σ", "asymmetry init", "asymmetry"});
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
  for (const Group& g : groups) {
    std::vector<std::string> cells;
    for (const auto& [key, value] : g.labels.items())
      cells.push_back(value.is_string() ? value.get<std::string>() : value.dump());
    cells.push_back(mean_sd(column(g, "accuracy"), "{:.3f}"));
    const std::vector<double> reached = column(g, "steps_to_target");
    cells.push_back(reached.empty() ? fmt::format("not reached (0/{})", g.runs.size())
                                    : fmt::format("{} ({}/{})", mean_sd(reached, "{:.0f}"), reached.size(), g.runs.size()));
    cells.push_back(mean_sd(column(g, "sigma_init"), "{:.3f}"));
    cells.push_back(mean_sd(column(g, "sigma"), "{:.3f}"));
    cells.push_back(mean_sd(column(g, "score_asymmetry_init"), "{:.3f}"));
    cells.push_back(mean_sd(column(g, "score_asymmetry"), "{:.3f}"));
    for (const Column& x : extras) cells.push_back(mean_sd(column(g, x.key.c_str()), x.format.c_str()));
    out += "| " + fmt::format("{}", fmt::join(cells, " | ")) + " |\n";
  }
  return out;
}

// Horizontal bars of mean accuracy with ±1 std whiskers and every seed as a dot; a dashed line at 2/3.
std::string accuracy_chart(const std::string& name, const Json& runs) {
  const std::vector<Group> groups = groups_of(runs);
  const double label_w = 260, plot_w = 400, row = 20, top = 40;
  const double height = top + row * double(groups.size()) + 40, width = label_w + plot_w + 30;
  const auto x = [&](double acc) { return label_w + plot_w * std::clamp(acc, 0.0, 1.0); };
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" viewBox=\"0 0 {:.0f} {:.0f}\" "
      "font-family=\"DejaVu Sans, sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height, width, height);
  s += fmt::format("<text x=\"8\" y=\"18\" font-size=\"13\" font-weight=\"bold\">qkv experiment {}: held-out accuracy "
                   "(mean ± std over seeds; dots: seeds)</text>\n",
                   escape_xml(name));
  for (double tick = 0; tick <= 1.0001; tick += 0.2) {
    s += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#ddd\"/>\n", x(tick), top - 4,
                     top + row * double(groups.size()));
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#555\">{:.1f}</text>\n", x(tick),
                     top + row * double(groups.size()) + 14, tick);
  }
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const Group& g = groups[i];
    const double y = top + row * double(i);
    const Stats a = stats(column(g, "accuracy"));
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", label_w - 6, y + row * 0.65,
                     escape_xml(label_text(g.labels)));
    s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#6baed6\"><title>{:.4f}</title></rect>\n",
                     label_w, y + 3, x(a.mean) - label_w, row - 6, a.mean);
    if (a.n > 1)
      s += fmt::format("<line x1=\"{0:.1f}\" x2=\"{1:.1f}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"#08306b\" stroke-width=\"1.5\"/>\n",
                       x(a.mean - a.sd), x(a.mean + a.sd), y + row / 2);
    for (double v : column(g, "accuracy"))
      s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.2\" fill=\"#08306b\"/>\n", x(v), y + row / 2);
  }
  s += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#b2182b\" stroke-dasharray=\"4 3\"/>\n",
                   x(2.0 / 3), top - 8, top + row * double(groups.size()));
  s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#b2182b\" text-anchor=\"middle\">2/3</text>\n", x(2.0 / 3),
                   top - 10);
  s += "</svg>\n";
  return s;
}

}  // namespace

std::vector<std::string> experiment_names() { return names_of(experiment_registry()); }

const ExperimentSpec& experiment_spec(const std::string& name) {
  return find_spec(experiment_registry(), name, "experiment");
}

TrainOptions experiment_run(const std::string& task, const ExperimentOptions& e, std::size_t n) {
  const TaskSpec& spec = task_spec(task);
  TrainOptions o = default_options(task, n);
  o.steps = e.steps ? e.steps : e.quick ? spec.quick_steps : spec.experiment_steps;
  o.warmup = std::min<std::size_t>(o.warmup, o.steps / 10 + 1);
  o.eval_batches = e.eval_batches;
  o.target = spec.target;
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
  const std::size_t seeds = e.seeds ? e.seeds : e.quick ? 1 : 5;
  const std::string out = e.out.empty() ? "runs/experiment-" + e.name : e.out;
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
      Json run = {{"experiment", e.name},
                            {"task", o.task},
                            {"variant", variant_of(o.model)},
                            {"embeddings", o.model.frozen_embeddings ? "frozen" : "learned"},
                            {"seed", seed},
                            {"labels", config.labels}};
      {
        Generator gen(o.seed);  // the same init as train()'s
        nn::Transformer init(o.model, gen);
        run["sigma_init"] = readout_sigma(init);
        run["score_asymmetry_init"] = readout_score_asymmetry(init, sequences);
        if (spec.at_init) spec.at_init(run, init, *task, sequences, seed);
      }
      progress << fmt::format("[{:>3}/{}] {}, seed {}", done + 1, total, label_text(config.labels), seed)
               << (tty ? "\n" : "") << std::flush;
      const TrainResult r = train(o, tty ? progress : quiet, tty);
      const auto model = load_model(o.out);
      run["accuracy"] = r.eval.accuracy;
      run["steps_to_target"] = r.steps_to_target ? Json(*r.steps_to_target) : Json(nullptr);
      run["target"] = o.target;
      run["steps"] = r.steps;
      run["seconds"] = r.seconds;
      run["sigma"] = readout_sigma(*model);
      run["score_asymmetry"] = readout_score_asymmetry(*model, sequences);
      if (spec.at_end) spec.at_end(run, *model, sequences);
      Probe probe;
      if (const TaskSpec& t = task_spec(o.task); t.probe) probe = t.probe(*model, seed);
      for (const auto& [key, value] : probe.values) run[key] = value;
      run["config"] = Json::parse(config_text(o));
      progress << fmt::format("{}: accuracy {:.4f}, {}, {:.1f} s\n", tty ? "  done" : "", r.eval.accuracy,
                              r.steps_to_target ? fmt::format("target at step {}", *r.steps_to_target)
                                                : std::string("target not reached"),
                              r.seconds)
               << std::flush;
      for (const std::string& violation : probe.violations)
        result.warnings.push_back(fmt::format("{}, seed {}: {}", label_text(config.labels), seed, violation));
      result.runs.push_back(std::move(run));
      ++done;
    }
  result.table = markdown_table(e.name, result.runs);
  for (const std::string& w : result.warnings) result.table += "\nWARNING: " + w + "\n";
  result.chart = accuracy_chart(e.name, result.runs);
  const Json file = {{"experiment", e.name}, {"quick", e.quick}, {"seed_start", e.seed_start}, {"seeds", seeds},
                     {"runs", result.runs}};
  nn::write_atomically(out + "/results.json", file.dump(1) + "\n");
  nn::write_atomically(out + "/" + e.name + ".svg", result.chart);
  nn::write_atomically(out + "/table.md", result.table);
  return result;
}

}  // namespace qkv::cli
