#include "qkv/training/options.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "qkv/nn/detail/json.hpp"
#include "qkv/nn/detail/transformer_json.hpp"
#include "qkv/nn/files.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/training/kept_checkpoints.hpp"

namespace qkv::training {

using namespace tasks;

namespace {

nlohmann::json model_json(const TrainOptions& o) {
  return o.encoder_layers ? nn::detail::encoder_decoder_config_json(encoder_decoder_config(o))
                          : nn::detail::transformer_config_json(o.model);
}

nlohmann::json config_json(const TrainOptions& o) {
  return {{"task", o.task}, {"n", o.n}, {"seed", o.seed}, {"steps", o.steps}, {"batch", o.batch}, {"warmup", o.warmup},
          {"lr", o.lr}, {"min_lr_ratio", o.min_lr_ratio}, {"weight_decay", o.weight_decay}, {"beta2", o.beta2},
          {"clip", o.clip}, {"train_fraction", o.train_fraction}, {"log_every", o.log_every},
          {"checkpoint_every", o.checkpoint_every}, {"snapshot_every", o.snapshot_every},
          {"keep_checkpoints", o.keep_checkpoints}, {"threads", o.threads}, {"blas", o.blas},
          {"mask_padding", o.mask_padding},
          {"model", model_json(o)}, {"tokens", token_names(*make_task(o))}};
}

template <class... Args>
[[noreturn]] void out_of_range(std::string field, fmt::format_string<Args...> text, Args&&... args) {
  throw OptionError(std::move(field), fmt::format(text, std::forward<Args>(args)...));
}

void check_range(const char* field, std::size_t value, std::size_t lo, std::size_t hi) {
  if (value < lo || value > hi) out_of_range(field, "is {}, out of range [{}, {}]", value, lo, hi);
}


}  // namespace

nn::EncoderDecoderConfig encoder_decoder_config(const TrainOptions& o) {
  const TaskInfo info = make_task(o)->info();
  if (!info.seq2seq) fail("train", "the {} task trains a decoder-only model, not an encoder-decoder", o.task);
  const nn::TransformerConfig& m = o.model;
  return {.src_vocab = info.seq2seq->source_vocab, .tgt_vocab = m.vocab_size, .max_src_len = o.max_source_len,
          .max_tgt_len = m.max_len, .encoder_layers = o.encoder_layers, .decoder_layers = m.layers, .d_model = m.d_model,
          .heads = m.heads, .d_head = m.d_head, .qk = m.qk, .proj = m.proj, .mlp = m.mlp, .positions = m.positions,
          .dtype = m.dtype};
}

namespace {

// The options' fields that an encoder-decoder's config.json names its own way; the others are
// "model." and the EncoderDecoderConfig field's name alike ("model.heads").
constexpr std::pair<std::string_view, std::string_view> encoder_decoder_fields[] = {
    {"model.vocab_size", "model.tgt_vocab"},   {"model.n_classes", "model.tgt_vocab"},
    {"model.max_len", "model.max_tgt_len"},    {"model.layers", "model.decoder_layers"},
    {"max_source_len", "model.max_src_len"},   {"encoder_layers", "model.encoder_layers"}};

// The options' field of an EncoderDecoderConfig field ("decoder_layers" is "model.layers").
std::string options_field(const std::string& field) {
  const std::string named = "model." + field;
  for (const auto& [option, config] : encoder_decoder_fields)
    if (config == named) return std::string(option);
  return named;
}

}  // namespace

std::string config_field(const TrainOptions& o, const std::string& field) {
  if (o.encoder_layers)
    for (const auto& [option, config] : encoder_decoder_fields)
      if (option == field) return std::string(config);
  return field;
}

namespace {

// The options of a seq2seq task: an encoder-decoder has no GQA, unscaled scores, frozen
// embeddings or other masks than its own.
void check_seq2seq_options(const TrainOptions& o, const TaskInfo& info) {
  const nn::TransformerConfig& m = o.model;
  check_range("encoder_layers", o.encoder_layers, 1, max_layers);
  check_range("max_source_len", o.max_source_len, info.seq2seq->max_source_len, max_width);
  const auto refuse = [&](const char* field, bool bad, const char* what) {
    if (bad) out_of_range(field, "is not for the {} task's encoder-decoder, which {}", o.task, what);
  };
  refuse("model.kv_heads", m.kv_heads != 0, "has a key and value head per query head");
  refuse("model.scale", !m.scale, "scales its scores by 1/sqrt(d_head)");
  refuse("model.embeddings", m.frozen_embeddings, "trains its embeddings");
  refuse("model.causal_layers", !m.causal || !m.causal_layers.empty(),
         "attends bidirectionally in the encoder and causally in the decoder");
  refuse("snapshot_every", o.snapshot_every != 0, "snapshots do not follow (they follow decoder-only models)");
  refuse("keep_checkpoints", !o.keep_checkpoints.empty(), "inspect --across-training does not read (it reads decoder-only models)");
  refuse("model.d_mlp", m.d_mlp != 0, "has an MLP of 4 d_model");
  refuse("model.activation", m.activation != nn::Activation::gelu, "has GELU MLPs");
  refuse("model.layer_norm", !m.layer_norm, "has LayerNorms");
  refuse("model.attention_bias", !m.attention_bias, "has attention biases");
  refuse("model.init", m.init != nn::Init::uniform, "draws its weights uniformly");
  try {
    nn::check(encoder_decoder_config(o));
  } catch (const nn::ConfigError& e) {
    throw OptionError(options_field(e.field), e.what());
  }
}

}  // namespace

void check_options(const TrainOptions& o) {
  const auto names = task_names();
  if (std::find(names.begin(), names.end(), o.task) == names.end())
    out_of_range("task", "'{}' is not a task: {}", o.task, fmt::join(names, ", "));
  check_range("steps", o.steps, 1, max_steps);
  check_range("batch", o.batch, 0, max_batch);
  check_range("log_every", o.log_every, 1, max_steps);
  check_range("warmup", o.warmup, 0, max_steps);
  check_range("checkpoint_every", o.checkpoint_every, 1, max_steps);
  check_range("snapshot_every", o.snapshot_every, 0, max_steps);
  check_range("threads", o.threads, 1, max_threads);
  // Adam moves each weight by about lr a step: past 10, nothing trains, and lr / (1 − β1ᵗ)
  // overflows for lr near the largest double.
  if (!(o.lr > 0 && o.lr <= 10)) out_of_range("lr", "is {}; it must be in (0, 10]", o.lr);
  if (!(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1)) out_of_range("min_lr_ratio", "is {}; it must be in [0, 1]", o.min_lr_ratio);
  if (!(o.weight_decay >= 0 && o.weight_decay <= 10))
    out_of_range("weight_decay", "is {}; it must be in [0, 10]", o.weight_decay);
  if (!(o.beta2 >= 0 && o.beta2 < 1)) out_of_range("beta2", "is {}; it must be in [0, 1)", o.beta2);
  if (!(o.clip >= 0 && std::isfinite(o.clip)))
    out_of_range("clip", "is {}; it must be finite, and positive (or 0: no clipping)", o.clip);

  try {
    task_size(o.task, o.n);
  } catch (const std::invalid_argument& e) {
    throw OptionError("n", e.what());
  }
  std::unique_ptr<Task> task;
  const bool dataset = bool(task_spec(o.task).make_dataset);
  if (!dataset && o.train_fraction != 0)
    out_of_range("train_fraction", "is {}, but the {} task draws its sequences: it has no split", o.train_fraction, o.task);
  if (dataset && !(o.train_fraction > 0 && o.train_fraction < 1))
    out_of_range("train_fraction", "is {}; it must be in (0, 1)", o.train_fraction);
  try {
    task = make_task(o);
  } catch (const std::invalid_argument& e) {  // n passed task_size: a data set's split is what failed
    throw OptionError(dataset ? "train_fraction" : "n", e.what());
  }
  if (const Split* split = task->split()) {
    const std::size_t rows = split->train.tokens.shape()[0];
    if (o.batch > rows)
      out_of_range("batch", "is {}, more than the {} examples the {} task trains on (0: all of them, a full batch)", o.batch,
                   rows, o.task);
  } else if (o.batch == 0) {
    out_of_range("batch", "is 0, a full batch, but the {} task draws its sequences: give a batch of 1 or more", o.task);
  }
  const TaskInfo info = task->info();
  const nn::TransformerConfig& m = o.model;
  if (m.vocab_size != info.vocab_size)
    out_of_range("model.vocab_size", "is {}, but the {} task has {} tokens", m.vocab_size, o.task, info.vocab_size);
  if (m.n_classes != info.n_classes)
    out_of_range("model.n_classes", "is {}, but the {} task has {} classes", m.n_classes, o.task, info.n_classes);
  if (m.readout != info.readout)
    out_of_range("model.readout", "is {}, but the {} task reads out by {}", nn::name_of(m.readout), o.task,
                 nn::name_of(info.readout));
  check_range("model.max_len", m.max_len, info.max_len, max_width);
  check_range("model.layers", m.layers, 1, max_layers);
  check_range("model.d_model", m.d_model, 1, max_width);
  check_range("model.heads", m.heads, 1, max_width);
  check_range("model.d_head", m.d_head, 0, max_width);
  if (info.seq2seq) return check_seq2seq_options(o, info);
  if (o.encoder_layers || o.max_source_len)
    out_of_range(o.encoder_layers ? "encoder_layers" : "max_source_len", "is for seq2seq tasks; the {} task trains a decoder-only model", o.task);
  try {
    nn::check(m);
  } catch (const nn::ConfigError& e) {
    throw OptionError("model." + e.field, e.what());
  }
  check_kept_checkpoints(o);
}

std::size_t step_rows(const TrainOptions& o) {
  if (o.batch) return o.batch;
  const auto task = make_task(o);
  if (!task->split()) fail("train", "batch 0 (a full batch) is for a data-set task; the {} task draws its sequences", o.task);
  return task->split()->train.tokens.shape()[0];
}

std::string config_text(const TrainOptions& o) { return config_json(o).dump(2) + "\n"; }

TrainOptions read_config(const std::string& dir) {
  const std::string file = dir + "/config.json";
  TrainOptions o = parse_config(nn::read_file(file, 1 << 20), file);
  o.out = dir;
  return o;
}

TrainOptions parse_config(std::string_view text, const std::string& file) {
  const nlohmann::json j = nn::detail::parse_json(text, file, 3);  // {"model": {"causal_layers": […]}}
  const nn::detail::FieldReader r(j, file);
  const std::string task = r.choice("task", task_names());
  TrainOptions o;
  try {  // absent from runs written before tasks had sizes
    o = default_options(task, r.has("n") ? r.count("n", 0, 1000) : 0);
  } catch (const std::invalid_argument& e) {
    r.fail_at("n", "{}", e.what());
  }
  o.seed = r.count("seed", 0, std::numeric_limits<std::uint64_t>::max());
  o.steps = r.count("steps", 1, max_steps);
  o.batch = r.count("batch", 0, max_batch);
  o.warmup = r.count("warmup", 0, max_steps);
  o.lr = r.number("lr");
  o.min_lr_ratio = r.number("min_lr_ratio");
  o.weight_decay = r.number("weight_decay");
  o.clip = r.number("clip");
  // Absent from runs written before they were options.
  if (r.has("beta2")) o.beta2 = r.number("beta2");
  o.train_fraction = r.has("train_fraction") ? r.number("train_fraction") : 0;
  if (r.has("log_every")) o.log_every = r.count("log_every", 1, max_steps);
  // Absent from runs written before they were recorded.
  if (r.has("checkpoint_every")) o.checkpoint_every = r.count("checkpoint_every", 1, max_steps);
  if (r.has("snapshot_every")) o.snapshot_every = r.count("snapshot_every", 0, max_steps);
  if (r.has("keep_checkpoints")) {
    o.keep_checkpoints = r.text("keep_checkpoints");
    try {
      keep_schedule(o.keep_checkpoints);
    } catch (const OptionError& e) {
      r.fail_at("keep_checkpoints", "{}", e.what());
    }
  }
  if (r.has("threads")) o.threads = r.count("threads", 1, max_threads);
  if (r.has("blas")) o.blas = r.text("blas");
  o.mask_padding = r.has("mask_padding") && r.flag("mask_padding");  // older runs trained without
  if (o.encoder_layers) {  // a seq2seq task's run: its model is an encoder-decoder
    const nn::EncoderDecoderConfig c = nn::detail::read_encoder_decoder_config(r.at("model"), file, "model.");
    const std::size_t source_vocab = make_task(task, o.n)->info().seq2seq->source_vocab;
    if (c.src_vocab != source_vocab)
      r.fail_at("model.src_vocab", "is {}, but the {} task's sources have {} tokens", c.src_vocab, task, source_vocab);
    o.model.vocab_size = o.model.n_classes = c.tgt_vocab;
    o.model.max_len = c.max_tgt_len, o.model.layers = c.decoder_layers, o.model.d_model = c.d_model;
    o.model.heads = c.heads, o.model.d_head = c.d_head, o.model.qk = c.qk, o.model.proj = c.proj, o.model.mlp = c.mlp;
    o.model.positions = c.positions;
    o.encoder_layers = c.encoder_layers, o.max_source_len = c.max_src_len;
  } else {
    o.model = nn::detail::read_transformer_config(r.at("model"), file, "model.");
  }
  // The task's token names, which inspect shows: absent from runs written before they were recorded.
  nlohmann::json tokens;
  try {
    tokens = token_names(*make_task(o));
  } catch (const std::invalid_argument& e) {
    r.fail_at(task_spec(task).make_dataset ? "train_fraction" : "n", "{}", e.what());
  }
  if (r.has("tokens") && r.at("tokens") != tokens)
    r.fail_at("tokens", "are not the {} task's tokens ({})", task, tokens.dump());
  r.only(config_json(o));
  try {
    check_options(o);  // not the memory: a run trained elsewhere may still load here
  } catch (const OptionError& e) {
    throw std::runtime_error(fmt::format("{}: '{}' {}", file, config_field(o, e.field), e.what()));
  }
  return o;
}

optim::Schedule training_schedule(const TrainOptions& o) {
  // At most half the run warms up, so that even a 1-step run has a schedule.
  const std::size_t warmup = std::clamp<std::size_t>(o.warmup, 1, std::max<std::size_t>(1, o.steps / 2));
  return optim::Schedule::warmup_cosine(o.lr, warmup, std::max(o.steps, warmup + 1), o.lr * o.min_lr_ratio);
}

void check_resume_options(const TrainOptions& recorded, const TrainOptions& options) {
  if (options.steps < recorded.steps)
    throw UsageError(fmt::format("--steps: is {}, fewer than the {} of the run in {}: a resume can extend a run, not "
                                 "shorten it",
                                 options.steps, recorded.steps, recorded.out));
  TrainOptions same = options;  // but for what a resume may change
  same.steps = recorded.steps;
  same.threads = recorded.threads;
  same.blas = recorded.blas;
  if (config_json(same) != config_json(recorded))
    throw UsageError(fmt::format("--resume: the options differ from those {}/config.json records; a resume may change "
                                 "only --steps (and --threads)",
                                 recorded.out));
}

TrainOptions resumed_options(const std::string& dir, const std::string& task, std::optional<std::size_t> steps) {
  TrainOptions o = read_config(dir);
  if (o.task != task) throw UsageError(fmt::format("--resume: the run in {} is a {} run, not {}", dir, o.task, task));
  if (steps) o.steps = *steps;
  o.resume = true;
  return o;
}

}  // namespace qkv::training
