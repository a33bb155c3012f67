// qkv sweep FILE [--out DIR] [-j N] [--list] [--index I --of N] [--collect [--partial]]: a grid of
// runs (sweep/sweep.hpp) on every core, or a slice of it on one worker of many.
#include <filesystem>
#include <iostream>
#include <memory>
#include <thread>

#include "examples/cli/command.hpp"
#include "qkv/sweep/sweep.hpp"

namespace qkv::cli {

namespace {

struct SweepArgs {
  std::string file, out;
  std::uint64_t jobs = std::max(1u, std::thread::hardware_concurrency());
  std::uint64_t index = 0, of = 1;
  bool list = false, collect = false, partial = false;
};

// Merges the results, prints the summary, and says what failed (exit 1) or is missing.
int collect_and_show(const sweep::Sweep& s, const std::string& out, bool partial) {
  const sweep::Collected c = sweep::collect(s, out, partial);
  fmt::print("{}\n", c.summary);
  fmt::print("{} runs merged into {}/results.jsonl, results.csv and summary.md", c.results.size(), out);
  if (!c.missing.empty()) fmt::print("; {} runs have no result yet", c.missing.size());
  fmt::print("\n");
  if (c.failed > 0) {
    fmt::print(stderr, "qkv: {} of {} runs failed: their errors are in {}/results.jsonl\n", c.failed, c.results.size(), out);
    return 1;
  }
  return 0;
}

int run_sweep(const SweepArgs& a) {
  if (a.index >= a.of) usage("--index", "must be below --of ({}), got {}", a.of, a.index);
  const sweep::Sweep s = sweep::read_sweep(a.file);
  if (a.list) {
    for (const sweep::Run& run : s.runs) fmt::print("{}\n", run.id);
    return 0;
  }
  const std::string out = a.out.empty() ? "runs/sweep-" + std::filesystem::path(a.file).stem().string() : a.out;
  if (a.collect) return collect_and_show(s, out, a.partial);
  fmt::print(stderr, "{} runs in {}; {} worker process{}{}\n", s.runs.size(), out, a.jobs, a.jobs == 1 ? "" : "es",
             a.of > 1 ? fmt::format(", slice {} of {}", a.index, a.of) : "");
  const sweep::WorkerReport r =
      sweep::run_workers(s, {.out = out, .jobs = std::size_t(a.jobs), .index = std::size_t(a.index), .of = std::size_t(a.of)},
                         std::cerr);
  if (a.of > 1) {  // one worker of many: the results are merged by --collect once all are done
    fmt::print("{}\n", nlohmann::json({{"slice", a.index}, {"of", a.of}, {"ran", r.ran}, {"failed", r.failed},
                                        {"finished", r.finished}, {"busy", r.busy}})
                           .dump());
    return r.failed > 0 ? 1 : 0;
  }
  return collect_and_show(s, out, r.busy > 0);
}

}  // namespace

void add_sweep(CLI::App& app, Command& run) {
  auto a = std::make_shared<SweepArgs>();
  auto* sub = app.add_subcommand("sweep", "Run a grid of runs from a sweep file, on every core or a slice of a cluster's workers");
  sub->add_option("FILE", a->file, "Sweep file: {\"tasks\": [...], \"grid\": {option: [values]}, \"fixed\": {option: "
                                   "value}, \"seeds\": {\"start\": S, \"count\": K}}")
      ->required();
  sub->add_option("--out", a->out, "Folder of the runs and results (default runs/sweep-NAME, NAME the file's)");
  sub->add_option("-j,--jobs", a->jobs, "Runs at once, each a process of one thread (default: the cores)")->check(whole(1, 1024));
  sub->add_flag("--list", a->list, "Print the run ids, one a line, and run nothing");
  auto* index = sub->add_option("--index", a->index, "Run the I-th slice of --of (from 0): runs I, I + N, ...")->check(whole(0, 1'000'000));
  auto* of = sub->add_option("--of", a->of, "Slices the runs are cut into")->check(whole(1, 1'000'000));
  index->needs(of);
  of->needs(index);
  auto* collect = sub->add_flag("--collect", a->collect, "Merge the results in --out (naming runs without one), and run nothing");
  sub->add_flag("--partial", a->partial, "With --collect: merge the results there are")->needs(collect);
  sub->callback([&run, a] { run = [a] { return run_sweep(*a); }; });
}

}  // namespace qkv::cli
