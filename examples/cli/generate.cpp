// qkv generate DIR --input TEXT [--tokens N] [--no-cache] [--temperature T --top-k K --seed S]: the
// input continued by a run whose task predicts the next token, or a seq2seq run's output for it.
#include <cmath>
#include <memory>
#include <optional>

#include "examples/cli/command.hpp"
#include "qkv/nn/generate.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/training/run_folder.hpp"

namespace qkv::cli {

namespace {

struct GenerateArgs {
  std::string dir, input;
  std::optional<std::uint64_t> tokens;
  bool no_cache = false;
  double temperature = 0;
  std::uint64_t top_k = 0, seed = 0;
};

// The sampling options, checked.
nn::Sampling sampling(const GenerateArgs& a) {
  if (!(a.temperature >= 0) || !std::isfinite(a.temperature)) usage("--temperature", "is {}; it must be 0 or more", a.temperature);
  if (a.top_k > 0 && a.temperature == 0) usage("--top-k", "needs --temperature: greedy decoding takes the likeliest token");
  return {.temperature = a.temperature, .top_k = a.top_k};
}

// A seq2seq run's output for the source --input, up to its end token.
int run_generate_seq2seq(const GenerateArgs& a, const tasks::Seq2SeqTask& task) {
  const auto model = training::load_encoder_decoder(a.dir);
  const nn::EncoderDecoderConfig& c = model->config();
  const std::vector<std::int64_t> source = input_tokens(task, a.input, c.max_src_len);
  const std::size_t count = a.tokens ? std::size_t(*a.tokens) : c.max_tgt_len;
  if (count > c.max_tgt_len) usage("--tokens", "{} pass the decoder's {} positions", count, c.max_tgt_len);
  Generator gen(a.seed);
  const IndexArray out = nn::generate(*model, tasks::one_row(source), task.sides().start, count, sampling(a), gen, !a.no_cache);
  fmt::print("{}\n", task.decode(std::vector<std::int64_t>(out.begin(), out.end())));
  return 0;
}

int run_generate(const GenerateArgs& a) {
  const training::TrainOptions o = training::read_config(a.dir);
  const auto task = tasks::make_task(o.task, o.n);
  if (const tasks::Seq2SeqTask* seq2seq = tasks::as_seq2seq(*task)) return run_generate_seq2seq(a, *seq2seq);
  const auto model = training::load_model(a.dir);
  const nn::TransformerConfig& c = model->config();
  // A run that cannot generate is the wrong run for the command: a bad command line.
  if (c.readout != nn::Readout::token || c.n_classes != c.vocab_size)
    usage(a.dir, "a {} model predicts {}, not the next token: it cannot generate", o.task,
          c.readout == nn::Readout::token ? "a class per position" : "positions");
  try {
    model->check_decodable();  // the library's check, named with the run
  } catch (const std::invalid_argument& e) {
    usage(a.dir, "{}", e.what());
  }
  const std::vector<std::int64_t> input = input_tokens(*task, a.input, c.max_len);
  if (input.size() == c.max_len) usage("--input", "{} tokens leave none of the model's {} positions to generate", input.size(), c.max_len);
  const std::size_t count = a.tokens ? std::size_t(*a.tokens) : c.max_len - input.size();
  if (input.size() + count > c.max_len)
    usage("--tokens", "{} after {} input tokens pass the model's {} positions", count, input.size(), c.max_len);
  const nn::Sampling s = sampling(a);
  Generator gen(a.seed);
  const IndexArray out = nn::generate(*model, tasks::one_row(input), count, s, gen, !a.no_cache);
  fmt::print("{}\n", task->decode(std::vector<std::int64_t>(out.begin(), out.end())));
  return 0;
}

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
  sub->callback([&run, a] { run = [a] { return run_generate(*a); }; });
}

}  // namespace qkv::cli
