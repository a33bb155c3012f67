// qkv experiment NAME|FILE.json [--quick] [--steps N] [--seed-start S] [--seeds K] [-j N] [--out DIR]
// [--force] [--print]: an experiment's sweep over seeds, on every core, its table on stdout.
#include <algorithm>
#include <iostream>
#include <memory>

#include <fmt/ranges.h>

#include "examples/cli/command.hpp"
#include "qkv/experiments/experiment.hpp"
#include "qkv/sweep/sweep.hpp"
#include "qkv/training/trainer.hpp"

namespace qkv::cli {

namespace {

struct ExperimentArgs {
  experiments::ExperimentOptions options;
  std::uint64_t seeds = 0, seed_start = 0;
  std::uint64_t jobs = default_jobs();
  bool seed_start_given = false, print = false;
};

// A markdown table on stdout; results.json, the chart and each run's folder under --out.
int run_experiment(ExperimentArgs a) {
  a.options.seeds = std::size_t(a.seeds);
  a.options.jobs = std::size_t(a.jobs);
  if (a.seed_start_given) a.options.seed_start = a.seed_start;
  const std::vector<std::string> names = experiments::experiment_names();
  if (!a.options.name.ends_with(".json") && std::find(names.begin(), names.end(), a.options.name) == names.end())
    throw training::UsageError(fmt::format("experiment: unknown experiment '{}' (known: {}; or a sweep file, FILE.json)",
                                           a.options.name, fmt::join(names, ", ")));
  if (a.print) {  // the sweep it would run, checked as it would be
    const nlohmann::ordered_json spec = experiments::experiment_sweep(a.options);
    sweep::parse_sweep(spec, a.options.name);
    fmt::print("{}\n", spec.dump(2));
    return 0;
  }
  training::stop_on_signals();  // a run stopped by Ctrl-C keeps its steps
  const experiments::ExperimentResult r = experiments::run_experiment(a.options, std::cerr, escapes_shown(2));
  fmt::print("{}", r.table);
  fmt::print(stderr, "qkv experiment: wrote {}\n", fmt::join(r.files, ", "));
  return 0;
}

}  // namespace

void add_experiment(CLI::App& app, Command& run) {
  using namespace experiments;
  auto a = std::make_shared<ExperimentArgs>();
  ExperimentOptions& e = a->options;
  auto* sub = app.add_subcommand("experiment", "Rerun an experiment on the teaching claims: a table over seeds");
  std::string names;
  for (const std::string& name : experiment_names())
    names += fmt::format("\n    {:<10} {}", name, experiment_description(name));
  sub->add_option("NAME", e.name,
                  "One of the experiments below, or a sweep file (FILE.json: a copy of one, edited; see --print):" + names)
      ->required();
  sub->add_flag("--quick", e.quick, fmt::format("One seed and {} steps a run: under 2 minutes", quick_steps));
  sub->add_option("--steps", e.steps, fmt::format("Steps of every run (default: the file's; {} with --quick)", quick_steps))
      ->check(whole(1, 1'000'000));
  sub->add_option("--seed-start", a->seed_start, "The first seed (default: the file's)")
      ->check(whole(0, 1'000'000'000))
      ->each([a](const std::string&) { a->seed_start_given = true; });
  sub->add_option("--seeds", a->seeds, "Seeds per configuration (default: the file's; 1 with --quick)")->check(whole(1, 1000));
  sub->add_flag("--print", a->print, "Print the sweep file it would run, and run nothing");
  add_jobs_option(*sub, a->jobs);
  sub->add_option("--out", e.out, "Folder for results.json, the chart and the runs");
  sub->add_flag("--force", e.force, "Replace the results of an experiment already in --out");
  sub->add_flag("--resume", e.resume,
                "Go on with the experiment in --out that stopped before it ended: its finished runs stay, the others run");
  sub->callback([&run, a] { run = [a] { return run_experiment(*a); }; });
}

}  // namespace qkv::cli
