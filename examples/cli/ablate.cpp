// qkv ablate DIR [--n N] [--seed S | --data FILE] [--json]: each head zero- and mean-ablated, and patched from a
// corrupted input.
#include <iostream>
#include <memory>

#include "examples/cli/command.hpp"
#include "qkv/report/ablate.hpp"
#include "qkv/training/run_analysis.hpp"

namespace qkv::cli {

namespace {

struct AblateArgs {
  std::string dir, data;
  std::uint64_t n = 1024, seed = 1;
  bool json = false;
};

}  // namespace

void add_ablate(CLI::App& app, Command& run) {
  auto a = std::make_shared<AblateArgs>();
  auto* sub = app.add_subcommand(
      "ablate", "Accuracy and loss with each head zero- or mean-ablated, and patched from a corrupted input");
  sub->add_option("DIR", a->dir, "Run folder (as qkv train --out)")->required();
  auto* n = sub->add_option("--n", a->n, "Sequences (rounded up to whole batches)")->check(whole(1, 10'000'000));
  auto* seed = sub->add_option("--seed", a->seed, "Seed of the fresh sequences (as qkv eval's)")->check(whole(0, UINT64_MAX));
  sub->add_option("--data", a->data,
                  "Ablate on the sequences of FILE instead (as qkv eval --data; patched where it gives corrupted tokens)")
      ->option_text("FILE")
      ->excludes(n)
      ->excludes(seed);
  sub->add_flag("--json", a->json, "Print the numbers as one JSON object");
  sub->callback([&run, a] {
    run = [a] {
      const analysis::Ablation ablation =
          a->data.empty() ? training::ablate_run(a->dir, std::size_t(a->n), a->seed) : training::ablate_run(a->dir, a->data);
      if (a->json) fmt::print("{}\n", report::to_json(ablation).dump());
      else report::print_ablation(std::cout, ablation);
      return 0;
    };
  });
}

}  // namespace qkv::cli
