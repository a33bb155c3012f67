// qkv generate DIR --input TEXT [--tokens N] [--no-cache] [--temperature T --top-k K --seed S]: the
// input continued by a run whose task predicts the next token, or a seq2seq run's output for it.
#include <memory>
#include <optional>

#include "examples/cli/command.hpp"
#include "qkv/training/run_analysis.hpp"

namespace qkv::cli {

namespace {

struct GenerateArgs {
  std::string dir, input;
  std::optional<std::uint64_t> tokens;
  bool no_cache = false;
  double temperature = 0;
  std::uint64_t top_k = 0, seed = 0;
};

}  // namespace

void add_generate(CLI::App& app, Command& run) {
  auto a = std::make_shared<GenerateArgs>();
  auto* sub = app.add_subcommand(
      "generate", "Continue an input with the model of a run whose task predicts the next token, or write a seq2seq run's output");
  sub->add_option("DIR", a->dir, "Run folder (as qkv train --out)")->required();
  sub->add_option("--input", a->input, "The tokens to continue, or a seq2seq task's source")->required();
  sub->add_option("--tokens", a->tokens, "Tokens to generate (default: up to the model's positions; a seq2seq output is printed up to its end token)")
      ->check(whole(1, tasks::max_width));
  sub->add_flag("--no-cache", a->no_cache, "Run the model on the whole sequence at every step");
  sub->add_option("--temperature", a->temperature, "Sample at this temperature (default 0: greedy)");
  sub->add_option("--top-k", a->top_k, "Sample among the k likeliest tokens only (default: all)")->check(whole(0, tasks::max_width));
  sub->add_option("--seed", a->seed, "Seed of the sampling")->check(whole(0, UINT64_MAX));
  sub->callback([&run, a] {
    run = [a] {
      const training::GenerateOptions g{.tokens = a->tokens ? std::optional<std::size_t>(*a->tokens) : std::nullopt,
                                        .cache = !a->no_cache,
                                        .temperature = a->temperature,
                                        .top_k = std::size_t(a->top_k),
                                        .seed = a->seed};
      fmt::print("{}\n", training::generate_run(a->dir, a->input, g));
      return 0;
    };
  });
}

}  // namespace qkv::cli
