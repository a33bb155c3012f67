// The qkv program: train toy attention models and look inside them.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <exception>
#include <iostream>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "qkv/analysis/ablate.hpp"
#include "qkv/report/ablate.hpp"
#include "qkv/analysis/alignment.hpp"
#include "qkv/report/alignment.hpp"
#include "qkv/experiments/experiment.hpp"
#include "qkv/nn/gradcheck_cases.hpp"
#include "qkv/analysis/inspect.hpp"
#include "qkv/report/inspect.hpp"
#include "qkv/analysis/history.hpp"
#include "qkv/report/snapshots.hpp"
#include "qkv/tasks/evaluate.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/training/memory.hpp"
#include "qkv/training/metrics_log.hpp"
#include "qkv/training/options.hpp"
#include "qkv/training/run_folder.hpp"
#include "qkv/training/trainer.hpp"
#include "qkv/core/runtime.hpp"
#include "qkv/nn/generate.hpp"
#include "qkv/nn/safetensors.hpp"
#include "qkv/version.hpp"

namespace {

using namespace qkv::tasks;
using namespace qkv::analysis;
using namespace qkv::report;
using namespace qkv::training;
using namespace qkv::experiments;

template <class... Args>
[[noreturn]] void usage(std::string_view option, fmt::format_string<Args...> text, Args&&... args) {
  throw UsageError(fmt::format("{}: {}", option, fmt::format(text, std::forward<Args>(args)...)));
}

// A whole number in [lo, hi], checked on the text before CLI11 converts it: the conversion would
// wrap "-1" into an unsigned option, and cap a number too large for its type.
CLI::Validator whole(std::uint64_t lo, std::uint64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        const auto value = qkv::parse_count(text);
        if (!value || *value < lo || *value > hi)
          return fmt::format("must be a whole number from {} to {}, got '{}'", lo, hi, text);
        return "";
      },
      fmt::format("INT in [{}, {}]", lo, hi));
}

// The option of `qkv train` that sets a field of config.json.
std::string option_of(const std::string& field) {
  static const std::map<std::string, std::string> options = {
      {"steps", "--steps"},           {"batch", "--batch"},           {"lr", "--lr"},
      {"threads", "--threads"},       {"checkpoint_every", "--checkpoint-every"}, {"snapshot_every", "--snapshot-every"},
      {"model.layers", "--layers"},   {"model.d_model", "--d-model"}, {"model.heads", "--heads"},
      {"model.d_head", "--d-head"},   {"model.kv_heads", "--kv-heads"}, {"n", "--n"},
      {"model.max_len", "--max-len"}, {"model.causal_layers", "--attention"}, {"encoder_layers", "--encoder-layers"},
      {"max_source_len", "--max-len"}, {"model.scale", "--no-scale"}, {"model.embeddings", "--embeddings"},
      {"model.qk", "--qk"}, {"model.proj", "--proj"}};
  const auto it = options.find(field);
  return it == options.end() ? field : it->second;
}

// One row per configuration; exit status 1 when any fails.
int run_gradcheck(const std::string& filter) {
  std::size_t passed = 0, failed = 0;
  fmt::print("{:<52} {:>12} {:>12}  {}\n", "check", "max abs err", "max rel err", "result");
  for (const auto& c : qkv::nn::gradcheck_cases()) {
    if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
    const qkv::GradcheckResult r = c.run();
    fmt::print("{:<52} {:>12.3e} {:>12.3e}  {}\n", c.name, r.max_abs_error, r.max_rel_error, r.passed ? "PASS" : "FAIL");
    if (!r.passed) fmt::print("    {}\n", r.failure);
    (r.passed ? passed : failed)++;
  }
  if (passed + failed == 0) {
    fmt::print(stderr, "qkv gradcheck: no check matches --filter '{}'\n", filter);
    return 2;
  }
  fmt::print("gradcheck: {} passed, {} failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

// --attention: "causal", "bidirectional", or one of them per layer, comma-separated; true for causal.
std::vector<bool> attention_masks(const std::string& text) {
  std::vector<bool> masks;
  std::size_t begin = 0;
  while (true) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    const std::string part = text.substr(begin, end - begin);
    if (part != "causal" && part != "bidirectional")
      throw std::invalid_argument(fmt::format("'{}' is not causal or bidirectional", part));
    masks.push_back(part == "causal");
    if (end == text.size()) return masks;
    begin = end + 1;
  }
}

int run_tasks() {
  for (const std::string& name : task_names()) fmt::print("{:<10} {}\n", name, make_task(name)->info().description);
  return 0;
}

// Accuracy on fresh sequences; also on longer ones where the task has them (brackets: 26-40) and
// the model's positions allow.
// A seq2seq run's outputs are also generated, greedily from the start token.
int run_eval(const std::string& dir, std::size_t n, std::uint64_t seed) {
  const TrainOptions o = read_config(dir);
  const auto task = make_task(o.task, o.n);
  const std::size_t batches = (n + o.batch - 1) / o.batch;
  nlohmann::json out = {{"task", o.task}, {"dir", dir}, {"sequences", batches * o.batch}, {"seed", seed}};
  if (const Seq2SeqTask* seq2seq = as_seq2seq(*task)) {
    const auto model = load_encoder_decoder(dir);
    const Metrics forced = evaluate(*model, *task, batches, o.batch, seed), written = evaluate_generation(*model, *seq2seq, batches, o.batch, seed);
    out.update({{"accuracy", forced.accuracy}, {"exact_match", forced.exact_match},
                {"generated", {{"accuracy", written.accuracy}, {"exact_match", written.exact_match}}}});
    fmt::print("{}\n", out.dump());
    return 0;
  }
  const auto model = load_model(dir);
  const Metrics metrics = evaluate(*model, *task, batches, o.batch, seed, o.mask_padding);
  out.update({{"accuracy", metrics.accuracy}, {"exact_match", metrics.exact_match}});
  const TaskSpec& spec = task_spec(o.task);
  // Lengths beyond training's, where the model has the positions (train --max-len).
  if (!spec.longer.empty()) out["longer"] = nlohmann::json::array();
  for (const LongerLengths& l : spec.longer) {
    const auto longer = l.make();
    if (longer->info().max_len <= o.model.max_len) {
      const Metrics m = evaluate(*model, *longer, batches, o.batch, seed, o.mask_padding);
      out["longer"].push_back({{"lengths", l.lengths}, {"accuracy", m.accuracy}, {"exact_match", m.exact_match}});
    } else {
      out["longer"].push_back({{"lengths", l.lengths}, {"accuracy", nullptr},
                               {"reason", fmt::format("the model has {} positions; lengths {} need {} (train --max-len)",
                                                      o.model.max_len, l.lengths, longer->info().max_len)}});
    }
  }
  fmt::print("{}\n", out.dump());
  return 0;
}

// Each head ablated in turn on fresh sequences: a table, or --json.
int run_ablate(const std::string& dir, std::size_t n, std::uint64_t seed, bool json) {
  const TrainOptions o = read_config(dir);
  if (o.encoder_layers)
    throw std::runtime_error(fmt::format("{}: a {} run, whose model is an encoder-decoder: qkv ablate reads decoder-only "
                                         "models (qkv inspect shows its cross-attention)",
                                         dir, o.task));
  const auto model = load_model(dir);
  const auto task = make_task(o.task, o.n);
  Ablation a = ablate(*model, *task, task_spec(o.task).corruption, (n + o.batch - 1) / o.batch, o.batch, seed, o.mask_padding);
  a.dir = dir;
  if (json) fmt::print("{}\n", to_json(a).dump());
  else print_ablation(std::cout, a);
  return 0;
}

struct GenerateArgs {
  std::string dir, input;
  std::optional<std::uint64_t> tokens;
  bool no_cache = false;
  double temperature = 0;
  std::uint64_t top_k = 0, seed = 0;
};

// The sampling options, checked.
qkv::nn::Sampling sampling(const GenerateArgs& a) {
  if (!(a.temperature >= 0) || !std::isfinite(a.temperature)) usage("--temperature", "is {}; it must be 0 or more", a.temperature);
  if (a.top_k > 0 && a.temperature == 0) usage("--top-k", "needs --temperature: greedy decoding takes the likeliest token");
  return {.temperature = a.temperature, .top_k = a.top_k};
}

// --input as tokens of `task`, at most `positions` of them.
std::vector<std::int64_t> input_tokens(const Task& task, const std::string& text, std::size_t positions) {
  std::vector<std::int64_t> input;
  try {
    input = task.encode(text);
  } catch (const std::invalid_argument& e) {
    usage("--input", "{}", e.what());
  }
  if (input.empty()) usage("--input", "holds no tokens");
  if (input.size() > positions) usage("--input", "{} tokens, but the model has {} positions", input.size(), positions);
  return input;
}

// A seq2seq run's output for the source --input, up to its end token.
int run_generate_seq2seq(const GenerateArgs& a, const Seq2SeqTask& task) {
  const auto model = load_encoder_decoder(a.dir);
  const qkv::nn::EncoderDecoderConfig& c = model->config();
  const std::vector<std::int64_t> source = input_tokens(task, a.input, c.max_src_len);
  const std::size_t count = a.tokens ? std::size_t(*a.tokens) : c.max_tgt_len;
  if (count > c.max_tgt_len) usage("--tokens", "{} pass the decoder's {} positions", count, c.max_tgt_len);
  qkv::Generator gen(a.seed);
  const qkv::IndexArray out = qkv::nn::generate(*model, one_row(source), task.sides().start, count, sampling(a), gen, !a.no_cache);
  fmt::print("{}\n", task.decode(std::vector<std::int64_t>(out.begin(), out.end())));
  return 0;
}

// The input, continued by the model of a run whose task predicts the next token, or a seq2seq
// run's output for it: one line of text.
int run_generate(const GenerateArgs& a) {
  const TrainOptions o = read_config(a.dir);
  const auto task = make_task(o.task, o.n);
  if (const Seq2SeqTask* seq2seq = as_seq2seq(*task)) return run_generate_seq2seq(a, *seq2seq);
  const auto model = load_model(a.dir);
  const qkv::nn::TransformerConfig& c = model->config();
  // A run that cannot generate is the wrong run for the command: a bad command line.
  if (c.readout != qkv::nn::Readout::token || c.n_classes != c.vocab_size)
    usage(a.dir, "a {} model predicts {}, not the next token: it cannot generate", o.task,
          c.readout == qkv::nn::Readout::token ? "a class per position" : "positions");
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
  const qkv::nn::Sampling s = sampling(a);
  qkv::Generator gen(a.seed);
  const qkv::IndexArray out = qkv::nn::generate(*model, one_row(input), count, s, gen, !a.no_cache);
  fmt::print("{}\n", task->decode(std::vector<std::int64_t>(out.begin(), out.end())));
  return 0;
}

// Whether the terminal at `fd` shows colours and in-place lines: a terminal, other than a dumb one.
bool escapes_shown(int fd) {
  const char* term = std::getenv("TERM");
  return ::isatty(fd) && !(term && std::string_view(term) == "dumb");
}

struct InspectArgs {
  std::string dir, input, html, svg;
  bool json = false;
};

// Writes the report of an inspection as --html, --svg and --json ask, or prints it.
template <class Report>
int show(const InspectArgs& a, const Report& report) {
  if (!a.html.empty()) {
    qkv::nn::write_atomically(a.html, to_html(report));
    fmt::print(stderr, "qkv inspect: wrote {}\n", a.html);
  }
  if (!a.svg.empty()) {
    const auto files = write_svgs(report, a.svg);
    fmt::print(stderr, "qkv inspect: wrote {} SVG files to {}\n", files.size(), a.svg);
  }
  if (a.json) {
    fmt::print("{}\n", to_json(report).dump());
  } else if (a.html.empty() && a.svg.empty()) {
    const bool color = escapes_shown(1) && std::getenv("NO_COLOR") == nullptr;
    print_report(std::cout, report, color);
  }
  return 0;
}

// A seq2seq run's cross-attention: its alignments.
int run_inspect_seq2seq(const InspectArgs& a, const Seq2SeqTask& task) {
  const auto model = load_encoder_decoder(a.dir);
  const std::vector<std::int64_t> source =
      a.input.empty() ? typical_source(task) : input_tokens(task, a.input, model->config().max_src_len);
  AlignmentInspection in = inspect_alignment(*model, task, source, a.dir);
  if (!a.html.empty() || !a.svg.empty()) in.history = read_history(a.dir, read_config(a.dir).model);  // only the pictures draw it
  return show(a, in);
}

// What the heads of a trained run learned: tables and heatmaps, --json, --html FILE, --svg DIR.
int run_inspect(const InspectArgs& a) {
  const TrainOptions o = read_config(a.dir);
  const auto task = make_task(o.task, o.n);
  if (const Seq2SeqTask* seq2seq = as_seq2seq(*task)) return run_inspect_seq2seq(a, *seq2seq);
  const auto model = load_model(a.dir);
  const std::vector<std::int64_t> input =
      a.input.empty() ? typical_input(*task) : input_tokens(*task, a.input, o.model.max_len);
  Inspection in = inspect(*model, *task, input, a.dir);
  if (!a.html.empty() || !a.svg.empty()) in.history = read_history(a.dir, o.model);  // only the pictures draw it
  return show(a, in);
}

// A markdown table on stdout; results.json, the chart and each run's folder under --out.
int run_experiment_command(ExperimentOptions e) {
  const ExperimentResult r = run_experiment(e, std::cerr, escapes_shown(2));
  fmt::print("{}", r.table);
  fmt::print(stderr, "qkv experiment: wrote {}\n", fmt::join(r.files, ", "));
  return 0;
}

int run_train(TrainOptions o) {
  TrainResult r;
  try {
    r = train(o, std::cerr, escapes_shown(2));
  } catch (const OptionError& e) {
    // A resumed run's options come from its config.json.
    if (o.resume) throw std::runtime_error(fmt::format("{}/config.json: '{}' {}", o.out, config_field(o, e.field), e.what()));
    usage(option_of(e.field), "{}", e.what());
  }
  const nlohmann::json line = {{"task", o.task}, {"accuracy", r.eval.accuracy}, {"exact_match", r.eval.exact_match},
                               {"steps", r.steps}, {"seconds", r.seconds},
                               {"loss", r.loss ? nlohmann::json(*r.loss) : nlohmann::json()},
                               {"out", o.out.empty() ? "runs/" + o.task : o.out}};
  fmt::print("{}\n", line.dump());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  qkv::use_fastest_blas_kernels();
  qkv::set_num_threads(1);  // and OpenBLAS single-threaded: `train --threads` sets more
  qkv::reuse_freed_memory();
  CLI::App app{"qkv: train small attention models and look inside them"};
  app.set_version_flag("--version", "qkv " QKV_VERSION);
  app.require_subcommand(1);

  std::string filter;
  auto* gradcheck = app.add_subcommand("gradcheck", "Check every op's gradient against finite differences (float64)");
  gradcheck->add_option("--filter", filter, "Only the checks whose name contains this text");

  auto* tasks = app.add_subcommand("tasks", "List the tasks");

  // Options start unset: the task's defaults fill what the command line leaves out.
  std::string task, qk, proj;
  std::optional<std::uint64_t> seed, steps, layers, encoder_layers, heads, d_model, d_head, kv_heads, batch, threads, checkpoint_every,
      snapshot_every,
      task_n, max_len;
  std::string positions;
  std::optional<double> lr;
  std::string out;
  bool no_scale = false, mlp = false, resume = false, force = false;
  const auto count = whole(1, max_steps);
  auto* train_cmd = app.add_subcommand("train", "Train a model on a task");
  train_cmd->add_option("TASK", task, fmt::format("{}", fmt::join(task_names(), ", ")))->required()->check(CLI::IsMember(task_names()));
  train_cmd->add_option("--out", out, "Run folder (default runs/TASK)");
  train_cmd->add_option("--max-len", max_len,
                        "Positions of the model (default: the task's longest sequence; a seq2seq task's on each side)")
      ->check(whole(1, max_width));
  train_cmd->add_option("--positions", positions, "learned (default) or sinusoidal")
      ->check(CLI::IsMember(qkv::nn::names_of(qkv::nn::all_positions)));
  std::string sizes_text;
  for (const TaskSpec& spec : task_registry())
    if (!spec.sizes.empty())
      sizes_text += fmt::format("{}{} {} (default {})", sizes_text.empty() ? "" : "; ", spec.name,
                                fmt::join(spec.sizes, ","), spec.default_size);
  train_cmd->add_option("--n", task_n, "The task's size: " + sizes_text)->check(whole(1, 1000));
  train_cmd->add_option("--seed", seed, "Seed of every random draw")->check(whole(0, UINT64_MAX));
  train_cmd->add_option("--steps", steps, "Optimizer steps")->check(count);
  train_cmd->add_option("--layers", layers, "Attention layers (a seq2seq task's: of the encoder and of the decoder)")
      ->check(whole(1, max_layers));
  train_cmd->add_option("--encoder-layers", encoder_layers, "A seq2seq task's encoder layers (default: --layers)")
      ->check(whole(1, max_layers));
  train_cmd->add_option("--heads", heads, "Query heads per layer")->check(whole(1, max_width));
  train_cmd->add_option("--d-model", d_model, "Width of the residual stream")->check(whole(1, max_width));
  train_cmd->add_option("--d-head", d_head, "Query/key width per head (default d_model / heads)")
      ->check(whole(1, max_width));
  train_cmd->add_option("--kv-heads", kv_heads, "Key/value heads (GQA/MQA; default: heads)")->check(whole(1, max_width));
  train_cmd->add_option("--qk", qk, "untied, tied (k = q: scores a Gram matrix) or symmetric (k = q ⊙ s: symmetric, indefinite)")
      ->check(CLI::IsMember(qkv::nn::names_of(qkv::nn::all_qk)));
  train_cmd->add_option("--proj", proj, "learned, frozen or identity")->check(CLI::IsMember(qkv::nn::names_of(qkv::nn::all_projections)));
  train_cmd->add_flag("--no-scale", no_scale, "Scores without the 1/sqrt(d_head) factor");
  train_cmd->add_flag("--mlp", mlp, "A LayerNorm + MLP (d_model -> 4 d_model -> d_model, GELU) after each attention");
  std::string embeddings, attention;
  train_cmd->add_option("--embeddings", embeddings, "learned, or frozen: embeddings and LayerNorms keep their init")
      ->check(CLI::IsMember({"learned", "frozen"}));
  train_cmd->add_option("--attention", attention,
                        "causal or bidirectional (default: the task's), or one per layer: causal,bidirectional")
      ->check([](const std::string& v) {
        try {
          attention_masks(v);
        } catch (const std::invalid_argument& e) {
          return std::string(e.what());
        }
        return std::string();
      });
  train_cmd->add_option("--lr", lr, "Peak learning rate, in (0, 10]");
  train_cmd->add_option("--batch", batch, "Sequences per step")->check(whole(1, max_batch));
  train_cmd->add_option("--threads", threads, "threads (default 1: these matrices are small)")->check(whole(1, max_threads));
  train_cmd->add_option("--checkpoint-every", checkpoint_every, "Steps between checkpoints (default 500; and at the end)")
      ->check(count);
  train_cmd->add_option("--snapshot-every", snapshot_every,
                        "Keep the heads' circuits and attention in snapshots.jsonl: at step 0, steps 10, 20, 30, 50, "
                        "100, ... below N, every N steps and at the end")
      ->check(count);
  train_cmd->add_flag("--resume", resume, "Continue the run in --out (default runs/TASK) from its last checkpoint");
  train_cmd->add_flag("--force", force,
                      "Replace the run in --out; the old run stays until the new one's first checkpoint");

  std::string eval_dir;
  std::uint64_t eval_n = 1024, eval_seed = 1;
  auto* eval = app.add_subcommand("eval", "Accuracy of a trained run on fresh sequences, as one JSON object");
  eval->add_option("DIR", eval_dir, "Run folder (as qkv train --out)")->required();
  eval->add_option("--n", eval_n, "Sequences (rounded up to whole batches)")->check(whole(1, 10'000'000));
  eval->add_option("--seed", eval_seed, "Seed of the fresh sequences")->check(whole(0, UINT64_MAX));

  std::string ablate_dir;
  std::uint64_t ablate_n = 1024, ablate_seed = 1;
  bool ablate_json = false;
  auto* ablate_cmd = app.add_subcommand(
      "ablate", "Accuracy and loss with each head zero- or mean-ablated, and patched from a corrupted input");
  ablate_cmd->add_option("DIR", ablate_dir, "Run folder (as qkv train --out)")->required();
  ablate_cmd->add_option("--n", ablate_n, "Sequences (rounded up to whole batches)")->check(whole(1, 10'000'000));
  ablate_cmd->add_option("--seed", ablate_seed, "Seed of the fresh sequences (as qkv eval's)")->check(whole(0, UINT64_MAX));
  ablate_cmd->add_flag("--json", ablate_json, "Print the numbers as one JSON object");

  GenerateArgs generate_args;
  auto* generate_cmd = app.add_subcommand(
      "generate", "Continue an input with the model of a run whose task predicts the next token, or write a seq2seq run's output");
  generate_cmd->add_option("DIR", generate_args.dir, "Run folder (as qkv train --out)")->required();
  generate_cmd->add_option("--input", generate_args.input, "The tokens to continue, or a seq2seq task's source")->required();
  generate_cmd->add_option("--tokens", generate_args.tokens, "Tokens to generate (default: up to the model's positions; a seq2seq output is printed up to its end token)")
      ->check(whole(1, max_width));
  generate_cmd->add_flag("--no-cache", generate_args.no_cache, "Run the model on the whole sequence at every step");
  generate_cmd->add_option("--temperature", generate_args.temperature, "Sample at this temperature (default 0: greedy)");
  generate_cmd->add_option("--top-k", generate_args.top_k, "Sample among the k likeliest tokens only (default: all)")
      ->check(whole(0, max_width));
  generate_cmd->add_option("--seed", generate_args.seed, "Seed of the sampling")->check(whole(0, UINT64_MAX));

  InspectArgs inspect_args;
  auto* inspect_cmd = app.add_subcommand("inspect", "Show what W_q, W_k and W_v of a trained run learned");
  inspect_cmd->add_option("DIR", inspect_args.dir, "Run folder (as qkv train --out)")->required();
  inspect_cmd->add_option("--input", inspect_args.input, "A sequence of the task (default: a typical one)");
  inspect_cmd->add_flag("--json", inspect_args.json, "Print the numbers as one JSON object");
  inspect_cmd->add_option("--html", inspect_args.html, "Write a self-contained HTML page of heatmaps to this file");
  inspect_cmd->add_option("--svg", inspect_args.svg, "Write each heatmap as an SVG file into this folder");

  ExperimentOptions experiment;
  std::uint64_t experiment_seeds = 0;
  auto* experiment_cmd = app.add_subcommand("experiment", "Rerun an experiment on the teaching claims: a table over seeds");
  std::string experiments_text;
  for (const ExperimentSpec& spec : experiment_registry())
    experiments_text += fmt::format("\n    {:<10} {}", spec.name, spec.description);
  experiment_cmd->add_option("NAME", experiment.name, "One of:" + experiments_text)
      ->required()
      ->check(CLI::IsMember(experiment_names()));
  experiment_cmd->add_flag("--quick", experiment.quick,
                           fmt::format("One seed and {} steps a run: under 2 minutes", quick_steps));
  experiment_cmd->add_option("--steps", experiment.steps,
                             fmt::format("Steps of every run (default {}; {} with --quick)", full_steps, quick_steps))
      ->check(whole(1, 1'000'000));
  experiment_cmd->add_option("--seed-start", experiment.seed_start, "The first seed (default 0)")
      ->check(whole(0, 1'000'000'000));
  experiment_cmd->add_option("--seeds", experiment_seeds, fmt::format("Seeds per configuration (default {}; 1 with --quick)", full_seeds))
      ->check(whole(1, 1000));
  experiment_cmd->add_option("--out", experiment.out, "Folder for results.json, the chart and the runs");
  experiment_cmd->add_flag("--force", experiment.force, "Replace the results of an experiment already in --out");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    if (*gradcheck) return run_gradcheck(filter);
    if (*tasks) return run_tasks();
    if (*inspect_cmd) return run_inspect(inspect_args);
    if (*experiment_cmd || *train_cmd) stop_on_signals();  // a run stopped by Ctrl-C keeps its steps
    if (*experiment_cmd) {
      experiment.seeds = std::size_t(experiment_seeds);
      return run_experiment_command(experiment);
    }
    if (*eval) return run_eval(eval_dir, std::size_t(eval_n), eval_seed);
    if (*ablate_cmd) return run_ablate(ablate_dir, std::size_t(ablate_n), ablate_seed, ablate_json);
    if (*generate_cmd) return run_generate(generate_args);
    if (*train_cmd) {
      qkv::set_num_threads(threads.value_or(1));
      if (resume) {
        for (auto* opt : train_cmd->get_options())
          if (opt->count() > 0 && !opt->check_name("TASK") && !opt->check_name("--out") &&
              !opt->check_name("--threads") && !opt->check_name("--resume") && !opt->check_name("--steps"))
            usage("--resume", "the run's options come from its config.json (but --steps, which extends it): drop {}",
                  opt->get_name());
        TrainOptions o = read_config(out.empty() ? "runs/" + task : out);
        if (o.task != task) usage("--resume", "the run in {} is a {} run, not {}", o.out, o.task, task);
        if (steps) o.steps = std::size_t(*steps);
        if (!threads) qkv::set_num_threads(o.threads);  // as the run started, unless asked otherwise
        o.resume = true;
        return run_train(o);
      }
      TrainOptions o;
      try {
        o = default_options(task, task_n.value_or(0));
      } catch (const std::invalid_argument& e) {
        usage("--n", "{}", e.what());
      }
      const auto set = [](const std::optional<std::uint64_t>& v, std::size_t& into) {
        if (v) into = std::size_t(*v);
      };
      set(steps, o.steps);
      set(layers, o.model.layers);
      if (o.encoder_layers) set(encoder_layers ? encoder_layers : layers, o.encoder_layers);
      else if (encoder_layers) usage("--encoder-layers", "is for seq2seq tasks; the {} task trains a decoder-only model", task);
      set(heads, o.model.heads);
      set(d_model, o.model.d_model);
      set(d_head, o.model.d_head);
      set(kv_heads, o.model.kv_heads);
      set(max_len, o.model.max_len);
      if (o.max_source_len) set(max_len, o.max_source_len);  // a seq2seq task's positions on each side
      if (!positions.empty()) o.model.positions = *qkv::nn::from_name(qkv::nn::all_positions, positions);
      set(batch, o.batch);
      set(checkpoint_every, o.checkpoint_every);
      set(snapshot_every, o.snapshot_every);
      if (seed) o.seed = *seed;
      if (lr) o.lr = *lr;
      if (!qk.empty()) o.model.qk = *qkv::nn::from_name(qkv::nn::all_qk, qk);
      if (!proj.empty())
        o.model.proj = *qkv::nn::from_name(qkv::nn::all_projections, proj);
      if (no_scale) o.model.scale = false;
      if (mlp) o.model.mlp = true;
      if (!embeddings.empty()) o.model.frozen_embeddings = embeddings == "frozen";
      if (!attention.empty()) {
        const std::vector<bool> masks = attention_masks(attention);
        if (masks.size() == 1) o.model.causal = masks[0];
        else o.model.causal_layers = masks;  // as many as layers: checked with the model
      }
      o.out = out;
      o.force = force;
      return run_train(o);
    }
  } catch (const UsageError& e) {
    fmt::print(stderr, "qkv: {}\n", e.what());
    return 2;
  } catch (const Interrupted& e) {
    fmt::print(stderr, "qkv: {}\n", e.what());
    return 128 + e.signal;
  } catch (const std::exception& e) {
    fmt::print(stderr, "qkv: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
