#pragma once
// `qkv experiment NAME`: rerunnable evidence for the teaching claims about W_q, W_k and W_v.
// Each experiment trains a grid of configurations over several seeds, and reports mean ± std per
// configuration as a markdown table, every run (with its curve along training) as JSON, and
// charts as SVG. Each experiment is an ExperimentSpec in a file of its own under experiments/,
// listed in experiments/registry.cpp (`qkv experiment --help` lists them).
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/sweep/measure.hpp"
#include "qkv/tasks/task.hpp"
#include "qkv/training/trainer.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/training/options.hpp"

namespace qkv::experiments {

using tasks::Column;
using tasks::Task;
using tasks::TrainOptions;

// The budgets of a full run and of a quick one: steps per run, and seeds.
inline constexpr std::size_t full_steps = 6000, full_seeds = 10, quick_steps = 300;
// The shorter budget the tables also report, from the curves.
inline constexpr std::size_t report_step = 1000;

struct ExperimentOptions {
  std::string name;
  bool quick = false;      // one seed and quick_steps: under 2 minutes
  std::size_t seeds = 0;   // 0: full_seeds, or 1 with quick
  std::uint64_t seed_start = 0;  // the seeds are seed_start, seed_start + 1, …
  std::string out{};       // "" means runs/experiment-NAME
  // Replace the results of an experiment already in `out`; without it, run_experiment refuses
  // such a folder (UsageError) before it trains anything.
  bool force = false;
  std::size_t steps = 0;   // of every run; 0: full_steps, or quick_steps with quick
  std::size_t eval_batches = 32;  // of 32 held-out sequences, for the accuracy at each curve point
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

// One configuration of an experiment: the labels that name it in the table, and how to train it.
struct ExperimentConfig {
  nlohmann::ordered_json labels;
  TrainOptions options;
};

// Unpadded held-out sequences of a run's task, on which its numbers are measured.
using sweep::Sequences;

// Everything the program knows about an experiment; nothing else names it.
struct ExperimentSpec {
  std::string name, description;
  std::function<std::vector<ExperimentConfig>(const ExperimentOptions&)> plan;  // the grid
  std::vector<Column> columns{};  // the table's columns of what at_init and at_end add to a run
  // Numbers of a run's model at init (before training: the same init as train's) and at the end.
  std::function<void(nlohmann::ordered_json& run, nn::Transformer& init, const Task& task, const Sequences& sequences,
                     std::uint64_t seed)>
      at_init{};
  std::function<void(nlohmann::ordered_json& run, const nn::Transformer& trained, const Sequences& sequences)> at_end{};
};

// Every registered experiment.
const std::vector<ExperimentSpec>& experiment_registry();
std::vector<std::string> experiment_names();
// Throws std::invalid_argument naming the experiment and listing the known ones.
const ExperimentSpec& experiment_spec(const std::string& name);

// What every experiment's runs start from: the task's defaults, with the experiment's budget
// (full_steps, quick_steps or ExperimentOptions::steps), checkpointed at the end only, and
// steps-to-target measured.
TrainOptions experiment_run(const std::string& task, const ExperimentOptions& e, std::size_t n = 0);
// Projections by name: untied, tied, symmetric (QK names), identity or frozen (projections).
void set_variant(TrainOptions& o, const std::string& variant);

// The steps at which a run's curve is measured (sweep::curve_steps).
using sweep::curve_steps;

// The markdown table of an experiment's runs: a row per configuration (the runs with the same
// labels) with the mean ± std over its seeds of the accuracy at step report_step (of runs that
// went past it) and at the end, steps to target (and how many reached it), σ and the score
// asymmetry at init and at the end, the experiment's columns and those of each task's probe.
std::string experiment_table(const std::string& name, const nlohmann::ordered_json& runs);

// Runs every configuration for every seed, writes OUT/results.json (each run with its curve),
// OUT/table.md, OUT/NAME.svg (final accuracy), OUT/NAME-accuracy.svg and
// OUT/NAME-score_asymmetry.svg (curves; the latter when some run has an asymmetry) and each run's
// folder under OUT/runs/, and shows progress on `progress`. Throws std::invalid_argument for an
// unknown name.
ExperimentResult run_experiment(const ExperimentOptions& options, std::ostream& progress, bool tty);

}  // namespace qkv::experiments
