#pragma once
// `qkv sweep FILE --out DIR`: any grid of runs, on every core, or sliced across the workers of a
// cluster. A sweep file names the runs:
//
//   {"tasks": ["rps", "cycle"], "grid": {"qk": ["untied", "tied"]}, "fixed": {"steps": 300},
//    "seeds": {"start": 3, "count": 2}}
//
// is 8 runs: each task × the product of the grid's lists × each seed, every run with the fixed
// options. Options are `qkv train`'s long options without dashes (training/run_options.hpp). A task
// may carry options of its own ({"task": "cycle", "n": 5}, labelled "cycle n=5" unless it gives
// "label"), and a grid key may name settings rather than list an option's values:
//
//   "grid": {"variant": {"untied": {}, "tied": {"qk": "tied"}, "identity": {"proj": "identity"}}}
//
// runs each of the three, labelled by its name. "measure" lists measurements of each run beside the
// built-in ones (measurements.hpp), and "description" says what the sweep is for.
//
// Every run checkpoints at its end (unless "checkpoint-every" says otherwise), logs ten times (unless
// "log-every" does), and
// measures its steps to the task's target every 50 steps (25 in runs of 300 steps or fewer).
//
// DIR holds sweep.json (the file last run there), a run folder a run (runs/ID/, as `qkv train
// --out` writes it), and a result a finished or failed run (results/ID.json). A worker walks the
// runs, takes each free one's lock (runs/ID.lock), trains and measures it (measure.hpp) and writes
// its result; a run with a result is finished. So any number of workers — processes of one
// machine, tasks of a Slurm array, MPI ranks — share one DIR: none runs a run another holds, and a
// killed worker's run (its lock gone, no result) is trained again on the next pass. Collecting
// merges the results into DIR/results.jsonl, DIR/results.csv and DIR/summary.md.
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/sweep/measure.hpp"
#include "qkv/tasks/train_options.hpp"

namespace qkv::sweep {

using tasks::TrainOptions;

struct Run {
  // Stable: the task (and its options), the grid's values or names, the seed, and 8 hex digits of a
  // hash of every option and the seed ("rps-qk=tied-seed3-56deea39"), so that a run whose fixed
  // options change is another run.
  std::string id;
  std::string task;
  // What names its configuration: {"task": the task's label, then each grid key: its value or name}.
  nlohmann::ordered_json labels;
  nlohmann::ordered_json options;  // every option the file gives it (fixed, the task's, the grid's), by name
  std::uint64_t seed = 0;
  TrainOptions train;  // what it trains, checked (check_options); out unset
  std::string label{};  // what progress calls it ("" : its id)
};

struct Sweep {
  std::string file;
  nlohmann::ordered_json spec;         // the file's JSON
  std::vector<std::string> grid_keys;  // what varies beside the task and the seed, as the file writes them
  std::vector<std::string> measurements;  // the file's "measure" (measurements.hpp)
  // Task by task, then the grid's product (its last key varying fastest), then seed by seed.
  std::vector<Run> runs;
};

// The most runs a sweep may name.
inline constexpr std::size_t max_runs = 1'000'000;

// A sweep file read and every run planned and checked, before anything runs: throws
// std::invalid_argument naming the file and the key at fault (an unknown key or option, a value the
// option refuses, a task qkv does not know, an option given twice, options that do not go
// together, naming the run).
Sweep read_sweep(const std::string& path);
// The file's JSON as it is, in its order, checked as JSON (size, depth, syntax) but not yet as a sweep.
nlohmann::ordered_json read_sweep_file(const std::string& path);
Sweep parse_sweep(const nlohmann::ordered_json& spec, const std::string& file);

// DIR made ready for workers: a new or empty folder, or one a sweep wrote (it has sweep.json), gets
// runs/, results/ and sweep.json (the sweep's file, written when it differs); anything else is
// refused (training::UsageError) before it is written to. run_workers calls it; so may a program
// that starts many workers, once before they start.
void prepare_folder(const Sweep& sweep, const std::string& out);

struct WorkerOptions {
  std::string out;             // DIR
  std::size_t jobs = 1;        // processes of this worker, each running one run at a time
  std::size_t index = 0, of = 1;  // the slice this worker runs: the runs at positions index, index + of, …
  Extras extras{};  // measurements of each run beside the built-in ones (an experiment's)
  bool stop_on_failure = false;  // a worker stops at the first run that fails (an experiment's)
  bool show_training = false;    // with jobs 1: each run's training as train shows it on a terminal
};

struct WorkerReport {
  std::size_t ran = 0, failed = 0;  // runs this worker trained (failed: recorded with their error, or not written)
  std::size_t finished = 0;         // runs of its slice finished before it started
  std::size_t busy = 0;             // runs of its slice without a result at the end: held by another worker
};

// Prepares DIR (refusing a folder that holds something other than a sweep, before writing to it),
// then, with the sweep's measurements beside any in `options`, runs the slice's runs that have not finished (no result, or a failed one's): with jobs > 1
// in as many child processes, each single-threaded. Progress, a line a run, goes to `progress`. A
// run that fails records its error as its result and the worker goes on. Ctrl-C or TERM stop the runs in progress (a stopped run
// writes no result) and throw training::Interrupted.
WorkerReport run_workers(const Sweep& sweep, const WorkerOptions& options, std::ostream& progress);
// The same for any list of runs (ids unique) in a folder that has runs/ and results/ (an
// experiment's): no sweep file, and no check of the folder.
WorkerReport run_runs(const std::vector<Run>& runs, const WorkerOptions& options, std::ostream& progress);
// A run's result in DIR (results/ID.json), or none when it has none yet; std::runtime_error naming
// a file that is not one, and the key at fault.
std::optional<nlohmann::ordered_json> result_of(const std::string& out, const Run& run);
// The keys of a result that say which run it is and how it went; the rest is what it measured.
const std::vector<std::string>& result_head_keys();

// A Slurm job array that runs the sweep: task I of T runs the I-th slice of T (`qkv sweep
// --index $SLURM_ARRAY_TASK_ID --of T -j 1`), each slice `per_task` runs (T = runs / per_task,
// rounded up), at most `throttle` tasks at once (`--array=0-T-1%throttle`; 0: no limit).
struct SlurmOptions {
  std::string out;                // DIR, where the script goes (DIR/sweep.sbatch) and the runs
  std::string program;            // the qkv program the tasks run (an absolute path)
  std::size_t per_task = 1;
  std::size_t throttle = 0;
  std::vector<std::string> sbatch{};  // more #SBATCH lines' options ("--partition=short", "--time=1:00:00")
};
// The script's text; its tasks read DIR/sweep.json, the file as this call found it.
std::string slurm_script(const Sweep& sweep, const SlurmOptions& options);
// Prepares DIR as run_workers does and writes DIR/sweep.sbatch (executable); returns its path.
std::string write_slurm_script(const Sweep& sweep, const SlurmOptions& options);

struct Collected {
  nlohmann::ordered_json results;   // a result a run, in the sweep's order (missing ones left out)
  std::vector<std::string> missing;  // runs without a result
  std::size_t failed = 0;
  std::string summary;  // markdown: a row a configuration
};

// Merges DIR's results of the sweep's runs into DIR/results.jsonl, DIR/results.csv and
// DIR/summary.md (one merge at a time: it waits for DIR/sweep.lock). A run without a result is an
// error naming it (std::runtime_error), unless `partial`, which merges what there is.
Collected collect(const Sweep& sweep, const std::string& out, bool partial);

// The table of DIR/results.csv: the run's id, task (and task_label where a label differs from its
// task), seed, the named settings, every option of the sweep's runs, then the metrics and the
// measurements' columns; a row per result, its values as the result holds them (null where it
// has none).
struct ResultsTable {
  std::vector<std::string> columns;
  std::vector<std::vector<nlohmann::ordered_json>> rows;
};
ResultsTable results_table(const Sweep& sweep, const nlohmann::ordered_json& results);

// The summary of results: a row per configuration (the runs that differ only in their seed) with
// the runs, the failed ones, the final accuracy's mean ± sd and "k of n" seeds that reached the
// task's target with a 95% Wilson interval.
std::string summary_table(const Sweep& sweep, const nlohmann::ordered_json& results);

}  // namespace qkv::sweep
