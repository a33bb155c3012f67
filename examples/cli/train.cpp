// qkv train TASK [options]: a model trained on a task, in a run folder; the task's defaults fill
// what the command line leaves out. Its last line is one JSON object.
#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <optional>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "examples/cli/command.hpp"
#include "qkv/core/runtime.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/training/trainer.hpp"

namespace qkv::cli {

namespace {

using tasks::TrainOptions;

// Options start unset: the task's defaults fill what the command line leaves out.
struct TrainArgs {
  std::string task, qk, proj, positions, embeddings, attention, out;
  std::optional<std::uint64_t> seed, steps, layers, encoder_layers, heads, d_model, d_head, kv_heads, batch, threads,
      checkpoint_every, snapshot_every, n, max_len;
  std::optional<double> lr;
  bool no_scale = false, mlp = false, resume = false, force = false;
};

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

// The options of a new run: the task's defaults, and what the command line gives.
TrainOptions new_run(const TrainArgs& a) {
  TrainOptions o;
  try {
    o = tasks::default_options(a.task, a.n.value_or(0));
  } catch (const std::invalid_argument& e) {
    usage("--n", "{}", e.what());
  }
  const auto set = [](const std::optional<std::uint64_t>& v, std::size_t& into) {
    if (v) into = std::size_t(*v);
  };
  set(a.steps, o.steps);
  set(a.layers, o.model.layers);
  if (o.encoder_layers) set(a.encoder_layers ? a.encoder_layers : a.layers, o.encoder_layers);
  else if (a.encoder_layers) usage("--encoder-layers", "is for seq2seq tasks; the {} task trains a decoder-only model", a.task);
  set(a.heads, o.model.heads);
  set(a.d_model, o.model.d_model);
  set(a.d_head, o.model.d_head);
  set(a.kv_heads, o.model.kv_heads);
  set(a.max_len, o.model.max_len);
  if (o.max_source_len) set(a.max_len, o.max_source_len);  // a seq2seq task's positions on each side
  if (!a.positions.empty()) o.model.positions = *nn::from_name(nn::all_positions, a.positions);
  set(a.batch, o.batch);
  set(a.checkpoint_every, o.checkpoint_every);
  set(a.snapshot_every, o.snapshot_every);
  if (a.seed) o.seed = *a.seed;
  if (a.lr) o.lr = *a.lr;
  if (!a.qk.empty()) o.model.qk = *nn::from_name(nn::all_qk, a.qk);
  if (!a.proj.empty()) o.model.proj = *nn::from_name(nn::all_projections, a.proj);
  if (a.no_scale) o.model.scale = false;
  if (a.mlp) o.model.mlp = true;
  if (!a.embeddings.empty()) o.model.frozen_embeddings = a.embeddings == "frozen";
  if (!a.attention.empty()) {
    const std::vector<bool> masks = attention_masks(a.attention);
    if (masks.size() == 1) o.model.causal = masks[0];
    else o.model.causal_layers = masks;  // as many as layers: checked with the model
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
  TrainOptions o = training::read_config(a.out.empty() ? "runs/" + a.task : a.out);
  if (o.task != a.task) usage("--resume", "the run in {} is a {} run, not {}", o.out, o.task, a.task);
  if (a.steps) o.steps = std::size_t(*a.steps);
  if (!a.threads) set_num_threads(o.threads);  // as the run started, unless asked otherwise
  o.resume = true;
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

void add_train(CLI::App& app, Command& run) {
  using namespace tasks;
  auto a = std::make_shared<TrainArgs>();
  const auto count = whole(1, max_steps);
  auto* sub = app.add_subcommand("train", "Train a model on a task");
  sub->add_option("TASK", a->task, fmt::format("{}", fmt::join(task_names(), ", ")))->required()->check(CLI::IsMember(task_names()));
  sub->add_option("--out", a->out, "Run folder (default runs/TASK)");
  sub->add_option("--max-len", a->max_len, "Positions of the model (default: the task's longest sequence; a seq2seq task's on each side)")
      ->check(whole(1, max_width));
  sub->add_option("--positions", a->positions, "learned (default) or sinusoidal")
      ->check(CLI::IsMember(nn::names_of(nn::all_positions)));
  std::string sizes;
  for (const TaskSpec& spec : task_registry())
    if (!spec.sizes.empty())
      sizes += fmt::format("{}{} {} (default {})", sizes.empty() ? "" : "; ", spec.name, fmt::join(spec.sizes, ","), spec.default_size);
  sub->add_option("--n", a->n, "The task's size: " + sizes)->check(whole(1, 1000));
  sub->add_option("--seed", a->seed, "Seed of every random draw")->check(whole(0, UINT64_MAX));
  sub->add_option("--steps", a->steps, "Optimizer steps")->check(count);
  sub->add_option("--layers", a->layers, "Attention layers (a seq2seq task's: of the encoder and of the decoder)")
      ->check(whole(1, max_layers));
  sub->add_option("--encoder-layers", a->encoder_layers, "A seq2seq task's encoder layers (default: --layers)")
      ->check(whole(1, max_layers));
  sub->add_option("--heads", a->heads, "Query heads per layer")->check(whole(1, max_width));
  sub->add_option("--d-model", a->d_model, "Width of the residual stream")->check(whole(1, max_width));
  sub->add_option("--d-head", a->d_head, "Query/key width per head (default d_model / heads)")->check(whole(1, max_width));
  sub->add_option("--kv-heads", a->kv_heads, "Key/value heads (GQA/MQA; default: heads)")->check(whole(1, max_width));
  sub->add_option("--qk", a->qk, "untied, tied (k = q: scores a Gram matrix) or symmetric (k = q ⊙ s: symmetric, indefinite)")
      ->check(CLI::IsMember(nn::names_of(nn::all_qk)));
  sub->add_option("--proj", a->proj, "learned, frozen or identity")->check(CLI::IsMember(nn::names_of(nn::all_projections)));
  sub->add_flag("--no-scale", a->no_scale, "Scores without the 1/sqrt(d_head) factor");
  sub->add_flag("--mlp", a->mlp, "A LayerNorm + MLP (d_model -> 4 d_model -> d_model, GELU) after each attention");
  sub->add_option("--embeddings", a->embeddings, "learned, or frozen: embeddings and LayerNorms keep their init")
      ->check(CLI::IsMember({"learned", "frozen"}));
  sub->add_option("--attention", a->attention, "causal or bidirectional (default: the task's), or one per layer: causal,bidirectional")
      ->check([](const std::string& v) {
        try {
          attention_masks(v);
        } catch (const std::invalid_argument& e) {
          return std::string(e.what());
        }
        return std::string();
      });
  sub->add_option("--lr", a->lr, "Peak learning rate, in (0, 10]");
  sub->add_option("--batch", a->batch, "Sequences per step")->check(whole(1, max_batch));
  sub->add_option("--threads", a->threads, "threads (default 1: these matrices are small)")->check(whole(1, max_threads));
  sub->add_option("--checkpoint-every", a->checkpoint_every, "Steps between checkpoints (default 500; and at the end)")->check(count);
  sub->add_option("--snapshot-every", a->snapshot_every,
                  "Keep the heads' circuits and attention in snapshots.jsonl: at step 0, steps 10, 20, 30, 50, 100, ... "
                  "below N, every N steps and at the end")
      ->check(count);
  sub->add_flag("--resume", a->resume, "Continue the run in --out (default runs/TASK) from its last checkpoint");
  sub->add_flag("--force", a->force, "Replace the run in --out; the old run stays until the new one's first checkpoint");
  sub->callback([&run, a, sub] { run = [a, sub] { return run_train(*a, *sub); }; });
}

}  // namespace qkv::cli
