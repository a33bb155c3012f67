#include "qkv/training/train.hpp"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <ostream>
#include <sstream>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "qkv/core/autograd.hpp"
#include "qkv/core/runtime.hpp"
#include "qkv/training/checkpoint.hpp"
#include "qkv/analysis/history.hpp"
#include "qkv/nn/checkpoint.hpp"
#include "qkv/nn/detail/json.hpp"
#include "qkv/nn/detail/transformer_json.hpp"
#include "qkv/nn/files.hpp"
#include "qkv/nn/generate.hpp"
#include "qkv/nn/safetensors.hpp"
#include "qkv/optim/adam.hpp"
#include "qkv/optim/schedule.hpp"

namespace qkv::cli {

namespace fs = std::filesystem;

namespace {

// The signal that asked a run to stop (SIGINT, SIGTERM), or 0.
std::atomic<int> stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);  // set from a signal handler

}  // namespace

namespace {

// Held-out sequences come from a generator no training batch uses.
constexpr std::uint64_t held_out_stream = 0x9e3779b97f4a7c15ULL;

nlohmann::json model_json(const TrainOptions& o) {
  return o.encoder_layers ? nn::detail::encoder_decoder_config_json(encoder_decoder_config(o))
                          : nn::detail::transformer_config_json(o.model);
}

nlohmann::json config_json(const TrainOptions& o) {
  return {{"task", o.task}, {"n", o.n}, {"seed", o.seed}, {"steps", o.steps}, {"batch", o.batch}, {"warmup", o.warmup},
          {"lr", o.lr}, {"min_lr_ratio", o.min_lr_ratio}, {"weight_decay", o.weight_decay}, {"clip", o.clip},
          {"checkpoint_every", o.checkpoint_every}, {"snapshot_every", o.snapshot_every}, {"threads", o.threads}, {"blas", o.blas},
          {"mask_padding", o.mask_padding},
          {"model", model_json(o)}, {"tokens", token_names(*make_task(o.task, o.n))}};
}

template <class... Args>
[[noreturn]] void out_of_range(std::string field, fmt::format_string<Args...> text, Args&&... args) {
  throw OptionError(std::move(field), fmt::format(text, std::forward<Args>(args)...));
}

void check_range(const char* field, std::size_t value, std::size_t lo, std::size_t hi) {
  if (value < lo || value > hi) out_of_range(field, "is {}, out of range [{}, {}]", value, lo, hi);
}

std::string bytes_text(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB"};
  std::size_t u = 0;
  while (bytes >= 1024 && u + 1 < std::size(units)) bytes /= 1024, ++u;
  return fmt::format("{:.1f} {}", bytes, units[u]);
}

}  // namespace

MemoryEstimate estimate_memory(const TrainOptions& o) {
  // In doubles: the sizes may be absurd, and the products must not wrap.
  const nn::TransformerConfig& m = o.model;
  const double D = double(m.d_model), L = double(m.layers), H = double(m.heads), T = double(m.max_len);
  const double S = double(o.max_source_len), encoder_layers = double(o.encoder_layers);
  const double Hkv = double(m.kv_heads ? m.kv_heads : m.heads);
  const double dh = double(nn::head_dim(m)), B = double(o.batch);  // check_options ran: heads ≥ 1
  const double qkv_width = (H + 2 * Hkv) * dh, mlp = m.mlp ? 1.0 : 0.0;
  // Each parameter: its value, gradient and Adam's two moments, in float32.
  MemoryEstimate e;
  const double parameters = o.encoder_layers ? nn::parameter_count(encoder_decoder_config(o)) : nn::parameter_count(m);
  // Fixed sinusoids are not parameters, but their float32 and float64 tables take 12 bytes a cell.
  e.model = 16 * parameters + (m.positions == nn::Positions::sinusoidal ? 12 * (T + S) * D : 0);
  // A step keeps, per layer, a few (B, T, D)-sized activations, the packed q/k/v, and the attention
  // weights (B, H, T, T, padded to 16 queries); backward allocates as much again for gradients. An
  // encoder-decoder's decoder layers attend twice, to themselves and to the source.
  const auto layer = [&](double queries, double keys) {  // Pᵀ: keys × queries padded to 16
    return B * queries * (6 * D + 2 * qkv_width + mlp * 14 * D) + 2 * B * H * keys * (std::ceil(queries / 16) * 16);
  };
  const double layers = encoder_layers * layer(S, S) + L * (layer(T, T) + (o.encoder_layers ? layer(T, S) : 0));
  e.step = 2 * 4 * (layers + B * T * (3 * D + 2 * double(m.n_classes)) + B * S * 3 * D);
  return e;
}

nn::EncoderDecoderConfig encoder_decoder_config(const TrainOptions& o) {
  const TaskInfo info = make_task(o.task, o.n)->info();
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
  check_range("batch", o.batch, 1, max_batch);
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
  if (!(o.clip > 0 && std::isfinite(o.clip))) out_of_range("clip", "is {}; it must be positive and finite", o.clip);

  try {
    task_size(o.task, o.n);
  } catch (const std::invalid_argument& e) {
    throw OptionError("n", e.what());
  }
  const TaskInfo info = make_task(o.task, o.n)->info();
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
}

void check_memory(const TrainOptions& o, bool training) {
  const nn::TransformerConfig& m = o.model;
  MemoryEstimate need = estimate_memory(o);
  if (!training) {  // the weights alone, and a forward pass with no gradients
    need.model /= 4;
    need.step /= 2;
  }
  const double available = nn::available_memory();
  if (need.model + need.step > available) {
    // The option to make smaller: of those whose value at the task's default would need less, the
    // one furthest above its default.
    const TrainOptions defaults = default_options(o.task, o.n);
    const MemoryEstimate full = estimate_memory(o);  // compared with the same estimates, unscaled
    const double total = full.model + full.step;
    const char* field = "batch";
    double furthest = 1;
    const auto consider = [&](const char* name, double value, double usual, auto reset) {
      TrainOptions smaller = o;
      reset(smaller);
      const MemoryEstimate e = estimate_memory(smaller);
      if (e.model + e.step < total && value / usual > furthest) {
        field = name;
        furthest = value / usual;
      }
    };
    const nn::TransformerConfig& d = defaults.model;
    const auto kv_heads = [](const nn::TransformerConfig& c) { return double(c.kv_heads ? c.kv_heads : c.heads); };
    consider("batch", double(o.batch), double(defaults.batch), [&](TrainOptions& s) { s.batch = defaults.batch; });
    consider("model.max_len", double(m.max_len), double(d.max_len), [&](TrainOptions& s) { s.model.max_len = d.max_len; });
    consider("model.layers", double(m.layers), double(d.layers), [&](TrainOptions& s) { s.model.layers = d.layers; });
    if (o.encoder_layers)
      consider("encoder_layers", double(o.encoder_layers), double(defaults.encoder_layers),
               [&](TrainOptions& s) { s.encoder_layers = defaults.encoder_layers; });
    consider("model.d_model", double(m.d_model), double(d.d_model), [&](TrainOptions& s) { s.model.d_model = d.d_model; });
    consider("model.heads", double(m.heads), double(d.heads), [&](TrainOptions& s) { s.model.heads = d.heads; });
    // d_head and kv_heads only where they were given: otherwise heads and d_model set them.
    if (m.d_head)
      consider("model.d_head", double(m.d_head), double(nn::head_dim(d)),
               [&](TrainOptions& s) { s.model.d_head = nn::head_dim(d); });
    if (m.kv_heads)
      consider("model.kv_heads", double(m.kv_heads), kv_heads(d),
               [&](TrainOptions& s) { s.model.kv_heads = std::size_t(kv_heads(d)); });
    out_of_range(field,
                 "needs about {} for the model{} and {} for a {} (batch {} of {} tokens, d_model {}, {} layers of {} "
                 "heads), more than the {} this machine has available",
                 bytes_text(need.model), training ? " and its optimizer state" : "", bytes_text(need.step),
                 training ? "training step" : "forward pass", o.batch, m.max_len, m.d_model, m.layers, m.heads,
                 bytes_text(available));
  }
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
  o.batch = r.count("batch", 1, max_batch);
  o.warmup = r.count("warmup", 0, max_steps);
  o.lr = r.number("lr");
  o.min_lr_ratio = r.number("min_lr_ratio");
  o.weight_decay = r.number("weight_decay");
  o.clip = r.number("clip");
  // Absent from runs written before they were recorded.
  if (r.has("checkpoint_every")) o.checkpoint_every = r.count("checkpoint_every", 1, max_steps);
  if (r.has("snapshot_every")) o.snapshot_every = r.count("snapshot_every", 0, max_steps);
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
  const nlohmann::json tokens = token_names(*make_task(task, o.n));
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

std::vector<std::string> token_names(const Task& task) {
  std::vector<std::string> names;
  for (std::size_t t = 0; t < task.info().vocab_size; ++t) names.push_back(task.token_name(std::int64_t(t)));
  return names;
}

TrainOptions default_options(const std::string& task_name, std::size_t n) {
  const TaskSpec& spec = task_spec(task_name);
  TrainOptions o;
  o.task = task_name;
  o.n = task_size(task_name, n);
  const TaskInfo info = spec.make(o.n)->info();
  o.model.vocab_size = info.vocab_size;
  o.model.n_classes = info.n_classes;
  o.model.max_len = info.max_len;
  o.model.readout = info.readout;
  o.model.causal = info.causal;
  if (info.seq2seq) {
    o.encoder_layers = 1;
    o.max_source_len = info.seq2seq->max_source_len;
  }
  spec.defaults(o);
  return o;
}

namespace {

// Checks that the run folder's model is (`seq2seq`) or is not an encoder-decoder, and that it fits
// in memory.
void check_run(const std::string& dir, bool seq2seq) {
  const TrainOptions o = read_config(dir);
  if ((o.encoder_layers > 0) != seq2seq)
    throw std::runtime_error(fmt::format("{}: a {} run, whose model is {}", dir, o.task,
                                         seq2seq ? "decoder-only, not an encoder-decoder"
                                                 : "an encoder-decoder: this reads decoder-only models"));
  try {
    check_memory(o, false);
  } catch (const OptionError& e) {
    throw std::runtime_error(fmt::format("{}/config.json: '{}' {}", dir, config_field(o, e.field), e.what()));
  }
}

}  // namespace

// The program's checks passed: the library's loaders do the rest.
std::unique_ptr<nn::Transformer> load_model(const std::string& dir) {
  check_run(dir, false);
  return nn::load_transformer(dir);
}

std::unique_ptr<nn::EncoderDecoder> load_encoder_decoder(const std::string& dir) {
  check_run(dir, true);
  return nn::load_encoder_decoder(dir);
}

MetricsLog::MetricsLog(std::string path, bool truncate)
    : path_(std::move(path)),
      out_(std::make_unique<std::ofstream>(path_, truncate ? std::ios::trunc : std::ios::app)) {
  if (!*out_) throw std::runtime_error(fmt::format("{}: cannot open for writing: {}", path_, std::strerror(errno)));
}

void MetricsLog::write(const std::string& line) {
  *out_ << line << '\n' << std::flush;
  if (!*out_) throw std::runtime_error(fmt::format("{}: writing failed: {}", path_, std::strerror(errno)));
}

void truncate_metrics(const std::string& path, std::size_t step, int max_depth) {
  std::error_code missing;
  if (!fs::exists(fs::symlink_status(path, missing))) return;
  const std::string text = nn::read_file(path, std::size_t(1) << 30);
  std::string kept;
  for (std::size_t begin = 0, end; (end = text.find('\n', begin)) != std::string::npos; begin = end + 1) {
    const std::string_view line(text.data() + begin, end - begin + 1);
    // A line past the checkpoint goes, to be written again; a line qkv did not write stays.
    std::optional<std::uint64_t> line_step;
    try {
      const nlohmann::json j = nn::detail::parse_json(line, path, max_depth);
      if (j.is_object() && j.contains("step") && j["step"].is_number_unsigned()) line_step = j["step"].get<std::uint64_t>();
    } catch (const std::runtime_error&) {
    }
    if (!line_step || *line_step <= step) kept += line;
  }
  if (kept != text) nn::write_atomically(path, kept);  // what is left after the last '\n' was cut short
}

Generator held_out_generator(std::uint64_t seed) { return Generator(seed ^ held_out_stream); }

MaskArray key_padding(const nn::Transformer& model, const Task& task, const IndexArray& tokens, bool mask_padding) {
  if (!mask_padding) return MaskArray();
  const auto pad = task.info().pad;
  bool bidirectional = false;
  for (std::size_t l = 0; l < model.blocks.size(); ++l) bidirectional = bidirectional || !model.causal(l);
  if (!pad || !bidirectional) return MaskArray();
  return xt::not_equal(tokens, *pad);
}

MaskArray source_padding(const Task& task, const IndexArray& source) {
  return xt::not_equal(source, as_seq2seq(task)->sides().source_pad);
}

namespace {

// A forward on a batch: the predictions at each position and, for a training step, the loss.
struct Forward {
  Tensor loss;  // undefined unless asked for
  IndexArray predictions;
};

Forward forward(const nn::Transformer& model, const Task& task, const Batch& b, bool mask_padding, bool loss) {
  const nn::TransformerOutput f = model.forward(b.tokens, false, key_padding(model, task, b.tokens, mask_padding));
  return {loss ? model.loss(f, b.targets) : Tensor(), nn::Transformer::predictions(f.logits)};
}

Forward forward(const nn::EncoderDecoder& model, const Task& task, const Batch& b, bool, bool loss) {
  const nn::EncoderDecoderOutput f = model.forward(b.source, b.tokens, false, source_padding(task, b.source));
  return {loss ? model.loss(f, b.targets) : Tensor(), nn::Transformer::predictions(f.logits)};
}

template <class Model>
Metrics evaluate_model(const Model& model, const Task& task, std::size_t batches, std::size_t batch_size, std::uint64_t seed,
                       bool mask_padding) {
  NoGradGuard no_grad;
  Generator gen = held_out_generator(seed);
  MetricsSum total;
  for (std::size_t i = 0; i < batches; ++i) {
    const Batch b = task.sample(batch_size, gen);
    total.add(score(forward(model, task, b, mask_padding, false).predictions, b));
  }
  return total.result();
}

}  // namespace

Metrics evaluate(const nn::Transformer& model, const Task& task, std::size_t batches, std::size_t batch_size, std::uint64_t seed,
                 bool mask_padding) {
  return evaluate_model(model, task, batches, batch_size, seed, mask_padding);
}

Metrics evaluate(const nn::EncoderDecoder& model, const Task& task, std::size_t batches, std::size_t batch_size,
                 std::uint64_t seed, bool mask_padding) {
  return evaluate_model(model, task, batches, batch_size, seed, mask_padding);
}

Metrics evaluate_generation(const nn::EncoderDecoder& model, const Seq2SeqTask& task, std::size_t batches,
                            std::size_t batch_size, std::uint64_t seed) {
  NoGradGuard no_grad;
  Generator gen = held_out_generator(seed), unused(0);  // greedy decoding draws nothing
  MetricsSum total;
  for (std::size_t i = 0; i < batches; ++i) {
    const Batch b = task.sample(batch_size, gen);
    const IndexArray written = nn::generate(model, b.source, task.sides().start, b.targets.shape()[1], {}, unused, true,
                                            source_padding(task, b.source));
    total.add(score(written, b));
  }
  return total.result();
}

namespace {

// The files of a run folder besides its checkpoint folders; FILE.tmp is a write of one that died.
const std::vector<std::string> run_files = {"config.json", "metrics.jsonl", "snapshots.jsonl", "model.safetensors",
                                            "optimizer.safetensors"};

// A folder a run has written: its config or a checkpoint (or its link, even one that points
// elsewhere).
bool holds_run(const std::string& dir) {
  if (fs::exists(dir + "/config.json") || !nn::checkpoint_folders(dir).empty()) return true;
  try {
    return nn::committed_checkpoint(dir).has_value();
  } catch (const std::runtime_error&) {  // a link of the run's that points elsewhere; a file is the user's
    std::error_code error;
    return fs::is_symlink(fs::symlink_status(dir + "/checkpoint", error));
  }
}

// Refuses a folder with files that are not a run's: the lock, or what a write that died left.
void check_holds_nothing_else(const std::string& dir) {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name != "run.lock" && !nn::is_partial_file(name, run_files)) throw UsageError(fmt::format("--out {}: holds '{}' and no qkv run; choose a new or empty folder", dir, name));
  }
}

// Where a run writes, locked: DIR itself, or, for a run that replaces another (--force),
// DIR.new.tmp until its first checkpoint, which then takes DIR's place. Nothing is written before
// the folder is known to be free for the run: a folder with files of its own is left as it is.
class RunFolder {
 public:
  RunFolder(std::string dir, const TrainOptions& o) : dir_(std::move(dir)) {
    std::error_code error;
    const bool exists = fs::exists(dir_, error);
    if (exists && !fs::is_directory(dir_, error)) throw UsageError(fmt::format("--out {}: is a file, not a folder", dir_));
    if (o.resume) {
      lock_.emplace(dir_);
      nn::remove_partial_files(dir_, run_files);
      nn::check_file_links(dir_, {"checkpoint", "model.safetensors", "optimizer.safetensors"});
      return;
    }
    const auto refuse = [&] {
      if (!o.force)
        throw UsageError(fmt::format("--out {}: holds a run already; give --resume to continue it or --force to "
                                     "replace it (the old run stays until the new one's first checkpoint)",
                                     dir_));
    };
    if (exists && holds_run(dir_)) refuse();
    if (exists && !holds_run(dir_)) check_holds_nothing_else(dir_);
    fs::create_directories(dir_);
    lock_.emplace(dir_);
    // Again under the lock: another process may have started a run here meanwhile.
    if (!holds_run(dir_)) {
      check_holds_nothing_else(dir_);
      nn::remove_partial_files(dir_, run_files);
      return;
    }
    refuse();
    fs::path target = fs::absolute(dir_).lexically_normal();
    if (!target.has_filename()) target = target.parent_path();
    if (target == target.root_path()) throw UsageError(fmt::format("--out {}: cannot be replaced", dir_));
    target_ = target.string();
    staging_ = target_ + ".new.tmp";
    if (fs::exists(staging_)) {
      staging_lock_.emplace(staging_);  // not while another process trains there
      staging_lock_.reset();
      fs::remove_all(staging_);  // what a replacement that died before its first checkpoint left
    }
    fs::create_directories(staging_);
    staging_lock_.emplace(staging_);
  }
  ~RunFolder() {
    std::error_code ignored;
    if (!staging_.empty()) fs::remove_all(staging_, ignored);  // a replacement that never checkpointed
  }
  RunFolder(const RunFolder&) = delete;
  RunFolder& operator=(const RunFolder&) = delete;

  const std::string& path() const { return staging_.empty() ? dir_ : staging_; }
  // Whether the run replaces another (--force) that is still in place: no checkpoint yet.
  bool replacing() const { return !staging_.empty(); }

  // After each checkpoint: a replacement run takes the old run's place at its first.
  void checkpointed() {
    if (staging_.empty()) return;
    nn::replace_folder(target_, staging_);
    staging_.clear();
    dir_ = target_;  // absolute: a relative path may have named the old folder (--out .)
    lock_.reset();  // the old run's lock, removed with it
    lock_.emplace(std::move(*staging_lock_));
    staging_lock_.reset();
  }

 private:
  std::string dir_, target_, staging_;
  std::optional<nn::RunLock> lock_, staging_lock_;
};

// Which parameters a training step updates: those that get a gradient (so not the frozen ones, nor
// one the readout never reads), found by one step's backward on a sequence from a generator of
// its own.
template <class Model>
std::vector<bool> updated_parameters(const Model& model, const Task& task) {
  Generator probe(1);
  const Batch b = task.sample(1, probe);
  const std::vector<Tensor> params = model.parameters();
  forward(model, task, b, true, true).loss.backward();
  std::vector<bool> updated;
  for (Tensor p : params) {
    updated.push_back(p.requires_grad() && p.grad().defined());
    p.zero_grad();
  }
  return updated;
}

// A run that extends its steps on resume (--resume --steps N): its config.json says N from now on.
// Says whether it equals a run trained to N steps from the start: it does when the learning rates
// of the steps it took already are those of an N-step schedule.
void extend(const std::string& dir, const TrainOptions& recorded, std::size_t steps, std::size_t done,
            std::ostream& notes) {
  TrainOptions extended = recorded;
  extended.steps = steps;
  const optim::Schedule before = training_schedule(recorded), after = training_schedule(extended);
  std::size_t differs = 0;
  while (differs < done && before.lr_at(differs) == after.lr_at(differs)) ++differs;
  notes << fmt::format("qkv train: extending {} from {} to {} steps; from step {} on, the learning rate follows the "
                       "{}-step schedule",
                       dir, recorded.steps, steps, done, steps);
  if (differs == done)
    notes << fmt::format(", as it did before: the run equals one trained to {} steps from the start\n", steps);
  else
    notes << fmt::format(". Steps {} to {} followed the {}-step one ({:.6g} rather than {:.6g} at step {}): the run "
                         "differs from one trained to {} steps from the start (a schedule with --min-lr-ratio 1 "
                         "after its warmup extends exactly)\n",
                         differs, done - 1, recorded.steps, before.lr_at(differs), after.lr_at(differs), differs, steps);
  nn::write_atomically(dir + "/config.json", config_text(extended));
}

// Says where a resumed run will not be bit-identical to an uninterrupted one.
void note_differences(const TrainOptions& recorded, std::ostream& notes) {
  if (recorded.threads != get_num_threads())
    notes << fmt::format("qkv train: the run started on {} threads and resumes on {}: its results may differ in the "
                         "last bits from an uninterrupted run's\n",
                         recorded.threads, get_num_threads());
  if (!recorded.blas.empty() && recorded.blas != blas_kernels())
    notes << fmt::format("qkv train: the run started on the {} BLAS kernels and resumes on {}: its results may differ "
                         "in the last bits from an uninterrupted run's\n",
                         recorded.blas, blas_kernels());
}

// The run of the options `o` (checked, with this machine's threads and BLAS) on `model`, built
// from `gen`, which then draws the training batches.
template <class Model>
TrainResult run(Model& model, const TrainOptions& o, const Task& task, Generator& gen,
                std::ostream& progress, bool tty, const TrainObserver& observe) {
  constexpr bool decoder_only = std::is_same_v<Model, nn::Transformer>;
  optim::Adam opt(model.parameters(), {.lr = o.lr, .weight_decay = o.weight_decay});
  const optim::Schedule schedule = training_schedule(o);

  fs::path out = fs::path(o.out.empty() ? "runs/" + o.task : o.out).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();  // "runs/x/" is "runs/x"
  RunFolder folder(out.string(), o);
  const std::string metrics_file = folder.path() + "/metrics.jsonl", snapshots_file = folder.path() + "/snapshots.jsonl";
  std::size_t first_step = 0;
  if (o.resume) {
    const TrainOptions recorded = read_config(folder.path());
    check_resume_options(recorded, o);
    note_differences(recorded, progress);
    const CheckpointCheck check{.max_step = o.steps, .updated = updated_parameters(model, task)};
    CheckpointState state;
    const auto restore = [&](const nn::Checkpoint& c) { state = restore_checkpoint(c, model, opt, check); };
    std::ostringstream notes;  // what the resume passed over: each note as "qkv train: …"
    const bool resumed = nn::resume_checkpoint(folder.path(), restore, notes).has_value();
    std::istringstream lines(notes.str());
    for (std::string line; std::getline(lines, line);) progress << (line.starts_with(" ") ? "" : "qkv train: ") << line << "\n";
    if (resumed) {
      first_step = state.step;
      gen.set_state(state.rng);
      progress << fmt::format("qkv train: resuming {} from step {} of {}\n", folder.path(), first_step, recorded.steps);
    } else {
      progress << fmt::format("qkv train: {} has no checkpoint yet; training from step 0\n", folder.path());
    }
    if (o.steps != recorded.steps) extend(folder.path(), recorded, o.steps, first_step, progress);
    truncate_metrics(metrics_file, first_step);
    // A run that starts again from step 0 writes its step-0 snapshot again.
    if (o.snapshot_every && first_step > 0) truncate_metrics(snapshots_file, first_step, snapshot_max_depth);
  } else {
    nn::write_atomically(folder.path() + "/config.json", config_text(o));
  }
  MetricsLog metrics(metrics_file, !o.resume);
  std::optional<MetricsLog> snapshots;
  std::optional<Snapshots> snapshot;
  if (o.snapshot_every) {  // check_options allows them for decoder-only models
    snapshots.emplace(snapshots_file, !o.resume || first_step == 0);
    snapshot.emplace(o, task);
  }

  const auto start = std::chrono::steady_clock::now();
  const auto since = [](auto t) { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count(); };
  double observing = 0;  // the observer's time, which the run's seconds leave out
  const auto elapsed = [&] { return since(start) - observing; };
  const auto observed = [&](std::size_t step) {
    if constexpr (decoder_only) {
      const auto t = std::chrono::steady_clock::now();
      if (snapshot && snapshot->due(step)) snapshots->write(snapshot->take(step, model).dump());
      if (observe) observe(step, model);
      observing += since(t);
    }
  };
  const std::size_t last_step = o.stop_after ? std::min(o.stop_after, o.steps) : o.steps;
  TrainResult result;
  double running_loss = 0, running_acc = 0;
  std::size_t since_log = 0;
  if (first_step == 0) observed(0);
  for (std::size_t step = first_step; step < last_step; ++step) {
    const Batch b = task.sample(o.batch, gen);
    schedule.apply(opt, step);
    opt.zero_grad();
    const Forward f = forward(model, task, b, o.mask_padding, true);
    f.loss.backward();
    optim::clip_grad_norm(model.parameters(), o.clip);
    opt.step();
    running_loss += f.loss.item();
    running_acc += score(f.predictions, b).accuracy;
    ++since_log;
    if ((step + 1) % o.log_every == 0 || step + 1 == o.steps) {
      const double seconds = elapsed(), rate = double(step + 1 - first_step) / seconds;
      const nlohmann::json line = {{"step", step + 1}, {"loss", running_loss / double(since_log)},
                                   {"accuracy", running_acc / double(since_log)}, {"lr", opt.lr()},
                                   {"seconds", seconds}};
      metrics.write(line.dump());
      const std::string text = fmt::format("step {:>5}/{}  loss {:.4f}  accuracy {:6.2f}%  {:.0f} steps/s  ETA {:.0f}s",
                                           step + 1, o.steps, running_loss / double(since_log),
                                           100 * running_acc / double(since_log), rate,
                                           double(o.steps - step - 1) / rate);
      progress << (tty ? "\r\033[K" : "") << text << (tty ? "" : "\n") << std::flush;
      result.loss = running_loss / double(since_log);
      running_loss = running_acc = 0;
      since_log = 0;
    }
    if (o.target_every && !result.steps_to_target && (step + 1) % o.target_every == 0 &&
        evaluate(model, task, o.target_batches, o.batch, o.seed, o.mask_padding).accuracy >= o.target)
      result.steps_to_target = step + 1;
    observed(step + 1);
    // A signal is answered once: a caller that goes on after Interrupted is not stopped again.
    const int signal = step + 1 < last_step ? stop_signal.exchange(0) : 0;
    const bool due = (step + 1) % o.checkpoint_every == 0 || step + 1 == last_step;
    if (signal && !due && folder.replacing())  // the run it would replace stays whole, as --force promises
      throw Interrupted(signal, fmt::format("interrupted at step {} of {}, before its first checkpoint: {} keeps the run "
                                            "it had",
                                            step + 1, o.steps, out.string()));
    if (due || signal) {
      save_checkpoint(folder.path(), model, opt, {.step = step + 1, .rng = gen.state()});
      folder.checkpointed();
    }
    if (signal) {
      if (tty) progress << "\n";
      throw Interrupted(signal, fmt::format("interrupted at step {} of {}; the checkpoint of step {} is in {}; continue "
                                            "with --resume",
                                            step + 1, o.steps, step + 1, folder.path()));
    }
  }
  if (tty) progress << "\n";
  result.steps = last_step;
  result.seconds = elapsed();
  result.eval = evaluate(model, task, o.eval_batches, o.batch, o.seed, o.mask_padding);
  return result;
}

// The model of the options, drawn from `gen`.
template <class Model, class Config>
std::unique_ptr<Model> build(const Config& config, Generator& gen) {
  try {
    return std::make_unique<Model>(config, gen);
  } catch (const std::invalid_argument& e) {
    throw OptionError("model", e.what());
  }
}

}  // namespace

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

namespace {

void request_stop(int signal) { stop_signal.store(signal); }

}  // namespace

void stop_on_signals() {
  struct sigaction action {};
  action.sa_handler = request_stop;
  action.sa_flags = SA_RESETHAND;  // a second Ctrl-C stops the program at once
  sigemptyset(&action.sa_mask);
  for (const int signal : {SIGINT, SIGTERM}) {
    struct sigaction old {};
    // A signal ignored when the program started stays ignored (a background job's SIGINT).
    if (sigaction(signal, nullptr, &old) == 0 && old.sa_handler != SIG_IGN) sigaction(signal, &action, nullptr);
  }
}

TrainResult train(const TrainOptions& options, std::ostream& progress, bool tty, const TrainObserver& observe) {
  if (const int signal = stop_signal.exchange(0)) throw Interrupted(signal, "interrupted before the run started");
  TrainOptions o = options;
  o.threads = get_num_threads();
  if (!o.resume) o.blas = blas_kernels();
  check_options(o);
  check_memory(o, true);
  const auto task = make_task(o.task, o.n);
  Generator gen(o.seed);
  if (o.encoder_layers) {
    if (observe) fail("train", "an observer sees decoder-only models, and the {} task trains an encoder-decoder", o.task);
    return run(*build<nn::EncoderDecoder>(encoder_decoder_config(o), gen), o, *task, gen, progress, tty, observe);
  }
  return run(*build<nn::Transformer>(o.model, gen), o, *task, gen, progress, tty, observe);
}

}  // namespace qkv::cli
