// qkv eval DIR [--n N] [--seed S | --data FILE]: a run's accuracy on fresh sequences, or on those of a
// file, as one JSON object.
#include <memory>

#include "examples/cli/command.hpp"
#include "qkv/training/run_analysis.hpp"

namespace qkv::cli {

namespace {

struct EvalArgs {
  std::string dir, data;
  std::uint64_t n = 1024, seed = 1;
};

}  // namespace

void add_eval(CLI::App& app, Command& run) {
  auto a = std::make_shared<EvalArgs>();
  auto* sub = app.add_subcommand("eval", "Accuracy of a trained run on fresh sequences, as one JSON object");
  sub->add_option("DIR", a->dir, "Run folder (as qkv train --out)")->required();
  auto* n = sub->add_option("--n", a->n, "Sequences (rounded up to whole batches)")->check(whole(1, 10'000'000));
  auto* seed = sub->add_option("--seed", a->seed, "Seed of the fresh sequences")->check(whole(0, UINT64_MAX));
  sub->add_option("--data", a->data, "Score the sequences of FILE instead (JSON lines of tokens and targets: any decoder-only run)")
      ->option_text("FILE")
      ->excludes(n)
      ->excludes(seed);
  sub->callback([&run, a] {
    run = [a] {
      const nlohmann::json result =
          a->data.empty() ? training::evaluate_run(a->dir, std::size_t(a->n), a->seed) : training::evaluate_run(a->dir, a->data);
      fmt::print("{}\n", result.dump());
      return 0;
    };
  });
}

}  // namespace qkv::cli
