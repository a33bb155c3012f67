// qkv train TASK [options]: a model trained on a task, in a run folder; the task's defaults fill
// what the command line leaves out. Its last line is one JSON object. The options that say what
// the run is are the library's table (training/run_options.hpp), which sweep files read too.
#include <iostream>
#include <memory>
#include <optional>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "examples/cli/command.hpp"
#include "qkv/core/runtime.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/training/run_options.hpp"
#include "qkv/training/trainer.hpp"

namespace qkv::cli {

namespace {

using tasks::TrainOptions;

struct TrainArgs {
  std::string task, out;
  nlohmann::json given = nlohmann::json::object();  // the run's options given, by name without dashes
  std::optional<std::uint64_t> threads;
  bool resume = false, force = false;
};

// The options of a new run: the task's defaults, and what the command line gives.
TrainOptions new_run(const TrainArgs& a) {
  TrainOptions o;
  try {
    o = training::run_options(a.task, a.given);
  } catch (const training::RunOptionError& e) {
    usage("--" + e.option, "{}", e.what());
  }
  o.out = a.out;
  o.force = a.force;
  return o;
}

// The options of a resumed run: its config.json's, with --steps (which extends it) and --threads.
TrainOptions resumed_run(const TrainArgs& a, const CLI::App& sub) {
  for (const CLI::Option* opt : sub.get_options())
    if (opt->count() > 0 && !opt->check_name("TASK") && !opt->check_name("--out") && !opt->check_name("--threads") &&
        !opt->check_name("--resume") && !opt->check_name("--steps"))
      usage("--resume", "the run's options come from its config.json (but --steps, which extends it): drop {}",
            opt->get_name());
  std::optional<std::size_t> steps;
  if (a.given.contains("steps")) steps = std::size_t(std::stoull(a.given["steps"].get<std::string>()));
  const TrainOptions o = training::resumed_options(a.out.empty() ? "runs/" + a.task : a.out, a.task, steps);
  if (!a.threads) set_num_threads(o.threads);  // as the run started, unless asked otherwise
  return o;
}

int run_train(const TrainArgs& a, const CLI::App& sub) {
  training::stop_on_signals();  // a run stopped by Ctrl-C keeps its steps
  set_num_threads(a.threads.value_or(1));
  const TrainOptions o = a.resume ? resumed_run(a, sub) : new_run(a);
  training::TrainResult r;
  try {
    r = training::train(o, std::cerr, escapes_shown(2));
  } catch (const training::OptionError& e) {
    // A resumed run's options come from its config.json.
    if (o.resume)
      throw std::runtime_error(fmt::format("{}/config.json: '{}' {}", o.out, training::config_field(o, e.field), e.what()));
    const std::string option = training::option_of_field(e.field);
    usage(option.empty() ? e.field : "--" + option, "{}", e.what());
  }
  fmt::print("{}\n", training::result_json(o, r).dump());
  return 0;
}

// The command-line option of a run option: its text checked by the table, kept by name.
void add_run_option(CLI::App& sub, const training::RunOption& option, nlohmann::json& given) {
  const std::string flag = "--" + option.name;
  if (option.kind == training::RunOption::Kind::flag) {
    sub.add_flag_callback(flag, [&given, name = option.name] { given[name] = true; }, option.help);
    return;
  }
  using Kind = training::RunOption::Kind;
  const std::string kind = option.kind == Kind::count ? "UINT" : option.kind == Kind::number ? "FLOAT" : "TEXT";
  const std::string values = option.kind == Kind::count    ? fmt::format("INT in [{}, {}]", option.min, option.max)
                             : option.kind == Kind::choice ? fmt::format("{{{}}}", fmt::join(option.choices, ","))
                                                           : "";
  sub.add_option_function<std::string>(flag, [&given, name = option.name](const std::string& v) { given[name] = v; },
                                       option.help)
      ->type_name(kind)
      ->check(CLI::Validator([&option](std::string& text) { return training::refusal(option, text); }, values));
}

}  // namespace

void add_train(CLI::App& app, Command& run) {
  using namespace tasks;
  auto a = std::make_shared<TrainArgs>();
  auto* sub = app.add_subcommand("train", "Train a model on a task");
  sub->add_option("TASK", a->task, fmt::format("{}", fmt::join(task_names(), ", ")))->required()->check(CLI::IsMember(task_names()));
  sub->add_option("--out", a->out, "Run folder (default runs/TASK)");
  for (const training::RunOption& option : training::run_option_table()) add_run_option(*sub, option, a->given);
  sub->add_option("--threads", a->threads, "threads (default 1: these matrices are small)")->check(whole(1, max_threads));
  sub->add_flag("--resume", a->resume, "Continue the run in --out (default runs/TASK) from its last checkpoint");
  sub->add_flag("--force", a->force, "Replace the run in --out; the old run stays until the new one's first checkpoint");
  sub->callback([&run, a, sub] { run = [a, sub] { return run_train(*a, *sub); }; });
}

}  // namespace qkv::cli
