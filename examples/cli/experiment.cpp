// qkv experiment NAME [--quick] [--steps N] [--seed-start S] [--seeds K] [-j N] [--out DIR] [--force]:
// an experiment's grid of runs over seeds, on every core, its table on stdout.
#include <iostream>
#include <memory>

#include <fmt/ranges.h>

#include "examples/cli/command.hpp"
#include "qkv/experiments/experiment.hpp"
#include "qkv/training/trainer.hpp"

namespace qkv::cli {

namespace {

struct ExperimentArgs {
  experiments::ExperimentOptions options;
  std::uint64_t seeds = 0;
  std::uint64_t jobs = default_jobs();
};

// A markdown table on stdout; results.json, the chart and each run's folder under --out.
int run_experiment(ExperimentArgs a) {
  training::stop_on_signals();  // a run stopped by Ctrl-C keeps its steps
  a.options.seeds = std::size_t(a.seeds);
  a.options.jobs = std::size_t(a.jobs);
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
  for (const ExperimentSpec& spec : experiment_registry()) names += fmt::format("\n    {:<10} {}", spec.name, spec.description);
  sub->add_option("NAME", e.name, "One of:" + names)->required()->check(CLI::IsMember(experiment_names()));
  sub->add_flag("--quick", e.quick, fmt::format("One seed and {} steps a run: under 2 minutes", quick_steps));
  sub->add_option("--steps", e.steps, fmt::format("Steps of every run (default {}; {} with --quick)", full_steps, quick_steps))
      ->check(whole(1, 1'000'000));
  sub->add_option("--seed-start", e.seed_start, "The first seed (default 0)")->check(whole(0, 1'000'000'000));
  sub->add_option("--seeds", a->seeds, fmt::format("Seeds per configuration (default {}; 1 with --quick)", full_seeds))
      ->check(whole(1, 1000));
  add_jobs_option(*sub, a->jobs);
  sub->add_option("--out", e.out, "Folder for results.json, the chart and the runs");
  sub->add_flag("--force", e.force, "Replace the results of an experiment already in --out");
  sub->callback([&run, a] { run = [a] { return run_experiment(*a); }; });
}

}  // namespace qkv::cli
