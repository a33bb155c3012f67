#pragma once
// `qkv experiment NAME`: rerunnable evidence for the teaching claims about W_q, W_k and W_v.
// An experiment is a sweep file (sweep/sweep.hpp) shipped with qkv — experiments/NAME.json in the
// sources, share/qkv/experiments/NAME.json installed, and in the library as text — or a user's copy
// of one. Running it runs the sweep (on every core) and reports mean ± std per configuration as a
// markdown table, every run (with its curve along training) as JSON, and charts as SVG.
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/tasks/registry.hpp"

namespace qkv::experiments {

using tasks::Column;

// The budget of a quick run: one seed of this many steps a configuration.
inline constexpr std::size_t quick_steps = 300;
// The shorter budget the tables also report, from the curves.
inline constexpr std::size_t report_step = 1000;

struct ExperimentOptions {
  // A shipped experiment's name, or the path of a sweep file (one ending in .json).
  std::string name;
  bool quick = false;      // one seed and quick_steps: under 2 minutes
  std::size_t seeds = 0;   // seeds a configuration; 0: the file's (1 with quick)
  std::optional<std::uint64_t> seed_start{};  // the first seed; none: the file's
  std::string out{};       // "" means runs/experiment-NAME
  // Replace the results of an experiment already in `out`; without it, run_experiment refuses
  // such a folder (UsageError) before it trains anything.
  bool force = false;
  // Go on with the experiment in `out` that stopped before it ended (its sweep.json the same
  // sweep): the runs it finished stay, the others run. UsageError for another sweep's folder.
  bool resume = false;
  std::size_t steps = 0;   // of every run; 0: the file's, or quick_steps with quick
  std::size_t jobs = 1;  // runs at once, each a process of one thread (sweep::run_runs)
};

struct ExperimentResult {
  nlohmann::ordered_json runs;  // one object per run; see docs/experiments.md
  std::string table;      // markdown: mean ± std per configuration
  std::string chart;      // SVG: final accuracy per configuration
  // SVGs of the curves along training, by what they draw ("accuracy", "score_asymmetry").
  std::vector<std::pair<std::string, std::string>> curves;
  std::vector<std::string> warnings;  // broken bounds (a bug): also at the end of the table
  std::vector<std::string> files;     // what it wrote, beside the runs' folders
};

// The charts of an experiment's runs: the final accuracy (ExperimentResult::chart) and the curves
// along training that some run has (ExperimentResult::curves), as run_experiment draws them.
std::pair<std::string, std::vector<std::pair<std::string, std::string>>> experiment_charts(
    const std::string& name, const nlohmann::ordered_json& runs);

// The shipped experiments, in the order `qkv experiment --help` lists them.
std::vector<std::string> experiment_names();
// A shipped experiment's sweep file, as text; std::invalid_argument naming it and listing the known ones.
const std::string& experiment_file(const std::string& name);
// Its "description".
std::string experiment_description(const std::string& name);

// The sweep an experiment runs: the file (shipped, or at the path `options.name`) with the
// options' budget in place of its own (and of a grid of budgets, as scale's). A budget shorter than
// the file's keeps the warmup to a tenth of the steps (plus one). What run_experiment writes to OUT/sweep.json: `qkv sweep` runs the same
// runs from it.
nlohmann::ordered_json experiment_sweep(const ExperimentOptions& options);

// The markdown table of an experiment's runs: a row per configuration (the runs with the same
// labels) with, over its seeds, the accuracy at step report_step (of runs that went past it) and at
// the end, σ and the score asymmetry at init and at the end, the columns of the sweep's
// measurements (`measure`) and those of each task's probe, each as mean ± sample sd (95% bootstrap
// interval of the mean, report::bootstrap_mean_interval); how many runs reached the task's target,
// "k of n (lo–hi%)" with the 95% Wilson interval; and the steps they took, as median (min–max).
std::string experiment_table(const std::vector<std::string>& measure, const nlohmann::ordered_json& runs);
// The table of a shipped experiment's runs, with the measurements its file names.
std::string experiment_table(const std::string& name, const nlohmann::ordered_json& runs);

// Runs the experiment's sweep into OUT (sweep.json, runs/, results/, and results.jsonl,
// results.csv and summary.md as `qkv sweep` collects them) and writes OUT/results.json (each run
// with its curve), OUT/table.md, OUT/NAME.svg (final accuracy), OUT/NAME-accuracy.svg and
// OUT/NAME-score_asymmetry.svg (curves; the latter when some run has an asymmetry); progress goes
// to `progress`. Throws std::invalid_argument for an unknown name or a file that is not a sweep.
ExperimentResult run_experiment(const ExperimentOptions& options, std::ostream& progress, bool tty);

}  // namespace qkv::experiments
