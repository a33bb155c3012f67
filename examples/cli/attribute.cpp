// qkv attribute DIR [--n N] [--seed S] [--json]: direct logit attribution of each head and layer.
#include <iostream>
#include <memory>

#include "examples/cli/command.hpp"
#include "qkv/report/logit_attribution.hpp"
#include "qkv/training/run_analysis.hpp"

namespace qkv::cli {

namespace {

struct AttributeArgs {
  std::string dir;
  std::uint64_t n = 256, seed = 1;
  bool json = false;
};

}  // namespace

void add_attribute(CLI::App& app, Command& run) {
  auto a = std::make_shared<AttributeArgs>();
  auto* sub = app.add_subcommand("attribute", "Direct logit attribution: what each head, MLP and embedding adds to the logit "
                                              "difference through the readout alone");
  sub->add_option("DIR", a->dir, "Run folder (as qkv train --out) of a task with the token readout")->required();
  sub->add_option("--n", a->n, "Held-out sequences, drawn as one batch")->check(whole(1, analysis::max_patch_sequences));
  sub->add_option("--seed", a->seed, "Seed of the held-out sequences (as qkv eval's)")->check(whole(0, UINT64_MAX));
  sub->add_flag("--json", a->json, "Print the numbers as one JSON object");
  sub->callback([&run, a] {
    run = [a] {
      const analysis::LogitAttribution r =
          training::logit_attribution_run(a->dir, {.sequences = std::size_t(a->n), .seed = a->seed});
      if (a->json) fmt::print("{}\n", report::to_json(r, a->dir).dump());
      else report::print_logit_attribution(std::cout, r, a->dir);
      return 0;
    };
  });
}

}  // namespace qkv::cli
