#include "qkv/training/run_options.hpp"

#include <algorithm>
#include <cstdlib>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "qkv/core/shape.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/training/kept_checkpoints.hpp"

namespace qkv::training {

using Kind = RunOption::Kind;
using tasks::max_batch;
using tasks::max_layers;
using tasks::max_steps;
using tasks::max_width;

namespace {

std::string task_sizes() {
  std::string sizes;
  for (const tasks::TaskSpec& spec : tasks::task_registry())
    if (!spec.sizes.empty() || spec.max_size > 0)
      sizes += fmt::format("{}{} {} (default {})", sizes.empty() ? "" : "; ", spec.name, tasks::sizes_text(spec),
                           spec.default_size);
  return sizes;
}

RunOption count(std::string name, std::uint64_t min, std::uint64_t max, std::string help) {
  return {.name = std::move(name), .kind = Kind::count, .help = std::move(help), .min = min, .max = max};
}

RunOption choice(std::string name, std::vector<std::string> choices, std::string help) {
  return {.name = std::move(name), .kind = Kind::choice, .help = std::move(help), .choices = std::move(choices)};
}

RunOption flag(std::string name, std::string help) { return {.name = std::move(name), .kind = Kind::flag, .help = std::move(help)}; }

// --attention's text: true for a causal layer.
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


std::optional<std::uint64_t> count_of(const nlohmann::json& value) {
  if (value.is_number_unsigned()) return value.get<std::uint64_t>();
  if (value.is_number_integer() && value.get<std::int64_t>() >= 0) return std::uint64_t(value.get<std::int64_t>());
  if (value.is_string()) return parse_count(value.get<std::string>());
  return std::nullopt;
}

std::optional<double> number_of(const nlohmann::json& value) {
  if (value.is_number()) return value.get<double>();
  if (!value.is_string()) return std::nullopt;
  const std::string text = value.get<std::string>();
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size()) return std::nullopt;  // inf and nan: check_options' to refuse
  return v;
}

std::optional<bool> flag_of(const nlohmann::json& value) {
  if (value.is_boolean()) return value.get<bool>();
  if (value == "true") return true;
  if (value == "false") return false;
  return std::nullopt;
}

// The option's name as the table spells it: dashes for underscores.
std::string dashed(std::string_view name) {
  std::string out(name);
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

// Why a text option's value is refused: not text, or what `parse` throws of it; "" when it reads.
template <class Parse>
std::string text_refusal(const nlohmann::json& value, const char* what, Parse parse) {
  if (!value.is_string()) return fmt::format("must be {}, got '{}'", what, value_text(value));
  try {
    parse(value.get<std::string>());
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

const std::vector<RunOption>& run_option_table() {
  static const std::vector<RunOption> table = {
      count("max-len", 1, max_width, "Positions of the model (default: the task's longest sequence; a seq2seq task's on each side)"),
      choice("positions", nn::names_of(nn::all_positions), "learned (default) or sinusoidal"),
      count("n", 1, 1000, "The task's size: " + task_sizes()),
      count("p", 1, 1000, "The modulus of modadd: its size, as --n"),
      {.name = "train-fraction",
       .kind = Kind::number,
       .help = "A data-set task's share of examples that train, in (0, 1); the rest are held out (modadd: 0.3)"},
      count("seed", 0, UINT64_MAX, "Seed of every random draw"),
      count("steps", 1, max_steps, "Optimizer steps"),
      count("layers", 1, max_layers, "Attention layers (a seq2seq task's: of the encoder and of the decoder)"),
      count("encoder-layers", 1, max_layers, "A seq2seq task's encoder layers (default: --layers)"),
      count("heads", 1, max_width, "Query heads per layer"),
      count("d-model", 1, max_width, "Width of the residual stream"),
      count("d-head", 1, max_width, "Query/key width per head (default d_model / heads)"),
      count("kv-heads", 1, max_width, "Key/value heads (GQA/MQA; default: heads)"),
      choice("qk", nn::names_of(nn::all_qk),
             "untied, tied (k = q: scores a Gram matrix) or symmetric (k = q ⊙ s: symmetric, indefinite)"),
      choice("proj", nn::names_of(nn::all_projections), "learned, frozen, identity (no W_q, W_k, W_v) or identity-qk (W_q = W_k = I, W_v learned)"),
      flag("no-scale", "Scores without the 1/sqrt(d_head) factor"),
      flag("mlp", "A LayerNorm + MLP (d_model -> 4 d_model -> d_model, GELU; --d-mlp, --activation) after each attention"),
      count("d-mlp", 1, max_width, "The MLP's hidden width (default 4 d_model)"),
      choice("activation", nn::names_of(nn::all_activations), "The MLP's activation: gelu (default) or relu"),
      flag("no-layer-norm", "No LayerNorm before the attention, the MLP or the readout"),
      flag("no-attention-bias", "The q, k, v and out projections without biases"),
      choice("init", nn::names_of(nn::all_inits),
             "uniform (default: PyTorch's modules') or normal (weights N(0, 1/d_model), the head's N(0, 1/classes), "
             "biases 0)"),
      choice("embeddings", {"learned", "frozen"}, "learned, or frozen: embeddings and LayerNorms keep their init"),
      {.name = "attention",
       .kind = Kind::masks,
       .help = "causal or bidirectional (default: the task's), or one per layer: causal,bidirectional"},
      {.name = "lr", .kind = Kind::number, .help = "Peak learning rate, in (0, 10]"},
      {.name = "min-lr-ratio", .kind = Kind::number, .help = "The learning rate at the end, as a share of --lr, in [0, 1] (1: constant after the warmup)"},
      {.name = "weight-decay", .kind = Kind::number, .help = "AdamW's decoupled weight decay, on every parameter, in [0, 10] (default 0)"},
      {.name = "beta2", .kind = Kind::number, .help = "AdamW's beta2, in [0, 1) (default 0.999)"},
      {.name = "clip", .kind = Kind::number, .help = "Clip the gradients' norm to this (default 1; 0: no clipping)"},
      count("batch", 0, max_batch, "Sequences per step (a data-set task: rows of its training split, 0 for all of them)"),
      count("log-every", 1, max_steps, "Steps between lines of metrics.jsonl (default 100)"),
      count("warmup", 0, max_steps, "Steps of linear learning-rate warmup (default 100; at most half the steps)"),
      count("checkpoint-every", 1, max_steps, "Steps between checkpoints (default 500; and at the end)"),
      count("snapshot-every", 1, max_steps,
            "Keep the heads' circuits and attention in snapshots.jsonl: at step 0, steps 10, 20, 30, 50, 100, ... "
            "below N, every N steps and at the end"),
      {.name = "keep-checkpoints",
       .kind = Kind::schedule,
       .help = "Keep the model's weights along training in OUT/checkpoints/ for inspect --across-training: log (at "
               "step 0, ten steps a decade from 10: 10, 13, 16, 20, 25, ..., and the last) or every:N"},
  };
  return table;
}

const RunOption* find_run_option(std::string_view name) {
  const std::string wanted = dashed(name);
  for (const RunOption& o : run_option_table())
    if (o.name == wanted) return &o;
  return nullptr;
}

std::string refusal(const RunOption& option, const nlohmann::json& value) {
  switch (option.kind) {
    case Kind::count: {
      const auto v = count_of(value);
      if (!v || *v < option.min || *v > option.max)
        return fmt::format("must be a whole number from {} to {}, got '{}'", option.min, option.max, value_text(value));
      return "";
    }
    case Kind::number:
      return number_of(value) ? "" : fmt::format("must be a number, got '{}'", value_text(value));
    case Kind::choice:
      if (value.is_string() && std::count(option.choices.begin(), option.choices.end(), value.get<std::string>()))
        return "";
      return fmt::format("must be one of {}, got '{}'", fmt::join(option.choices, ", "), value_text(value));
    case Kind::flag:
      return flag_of(value) ? "" : fmt::format("must be true or false, got '{}'", value_text(value));
    case Kind::masks:
      return text_refusal(value, "causal or bidirectional, or one per layer", [](const std::string& t) { attention_masks(t); });
    case Kind::schedule:
      return text_refusal(value, "log or every:N", [](const std::string& t) { keep_schedule(t); });
  }
  return "";
}

std::string value_text(const nlohmann::json& value) {
  std::string text = value.is_string() ? value.get<std::string>() : value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

nlohmann::json normalized_value(const RunOption& option, const nlohmann::json& value) {
  switch (option.kind) {
    case Kind::count:
      return *count_of(value);
    case Kind::number:
      return *number_of(value);
    case Kind::flag:
      return *flag_of(value);
    case Kind::choice:
    case Kind::masks:
    case Kind::schedule:
      return value;
  }
  return value;
}

TrainOptions run_options(const std::string& task, const nlohmann::json& given) {
  if (!given.is_object()) throw RunOptionError("", fmt::format("the options are {}, not an object of names and values", given.type_name()));
  // Each given value checked, by the table's spelling of its name.
  std::map<std::string, nlohmann::json> values;
  for (const auto& [name, value] : given.items()) {
    const RunOption* option = find_run_option(name);
    if (!option) throw RunOptionError(name, "is not an option of qkv train");
    if (const std::string why = refusal(*option, value); !why.empty()) throw RunOptionError(option->name, why);
    values[option->name] = value;
  }
  const auto has = [&](const char* name) { return values.count(name) > 0; };
  const auto count = [&](const char* name) { return std::size_t(*count_of(values.at(name))); };
  const auto set = [&](const char* name, std::size_t& into) {
    if (has(name)) into = count(name);
  };
  TrainOptions o;
  if (has("n") && has("p")) throw RunOptionError("p", "is the task's size, as --n: give one of them");
  const char* size = has("p") ? "p" : "n";
  try {
    o = tasks::default_options(task, has(size) ? count(size) : 0);
  } catch (const std::invalid_argument& e) {
    throw RunOptionError(size, e.what());
  }
  if (has("p") && !tasks::task_spec(task).make_dataset)
    throw RunOptionError("p", fmt::format("is modadd's modulus; the {} task's size is --n", task));
  set("steps", o.steps);
  set("layers", o.model.layers);
  if (o.encoder_layers) set(has("encoder-layers") ? "encoder-layers" : "layers", o.encoder_layers);
  else if (has("encoder-layers"))
    throw RunOptionError("encoder-layers", fmt::format("is for seq2seq tasks; the {} task trains a decoder-only model", task));
  set("heads", o.model.heads);
  set("d-model", o.model.d_model);
  set("d-head", o.model.d_head);
  set("kv-heads", o.model.kv_heads);
  set("max-len", o.model.max_len);
  if (o.max_source_len) set("max-len", o.max_source_len);  // a seq2seq task's positions on each side
  if (has("positions")) o.model.positions = *nn::from_name(nn::all_positions, values.at("positions").get<std::string>());
  set("batch", o.batch);
  set("warmup", o.warmup);
  set("log-every", o.log_every);
  set("d-mlp", o.model.d_mlp);
  if (has("activation")) o.model.activation = *nn::from_name(nn::all_activations, values.at("activation").get<std::string>());
  if (has("init")) o.model.init = *nn::from_name(nn::all_inits, values.at("init").get<std::string>());
  if (has("no-layer-norm")) o.model.layer_norm = !*flag_of(values.at("no-layer-norm"));
  if (has("no-attention-bias")) o.model.attention_bias = !*flag_of(values.at("no-attention-bias"));
  const auto number = [&](const char* name, double& into) {
    if (has(name)) into = *number_of(values.at(name));
  };
  number("min-lr-ratio", o.min_lr_ratio);
  number("weight-decay", o.weight_decay);
  number("beta2", o.beta2);
  number("clip", o.clip);
  number("train-fraction", o.train_fraction);
  set("checkpoint-every", o.checkpoint_every);
  set("snapshot-every", o.snapshot_every);
  if (has("keep-checkpoints")) o.keep_checkpoints = values.at("keep-checkpoints").get<std::string>();
  if (has("seed")) o.seed = *count_of(values.at("seed"));
  number("lr", o.lr);
  if (has("qk")) o.model.qk = *nn::from_name(nn::all_qk, values.at("qk").get<std::string>());
  if (has("proj")) o.model.proj = *nn::from_name(nn::all_projections, values.at("proj").get<std::string>());
  if (has("no-scale")) o.model.scale = !*flag_of(values.at("no-scale"));
  if (has("mlp")) o.model.mlp = *flag_of(values.at("mlp"));
  if (has("embeddings")) o.model.frozen_embeddings = values.at("embeddings") == "frozen";
  if (has("attention")) {
    const std::vector<bool> masks = attention_masks(values.at("attention").get<std::string>());
    if (masks.size() == 1) o.model.causal = masks[0];
    else o.model.causal_layers = masks;  // as many as layers: checked with the model
  }
  return o;
}

std::string option_of_field(const std::string& field) {
  static const std::map<std::string, std::string> options = {
      {"steps", "steps"},           {"batch", "batch"},           {"warmup", "warmup"},           {"lr", "lr"},
      {"threads", "threads"},       {"checkpoint_every", "checkpoint-every"}, {"snapshot_every", "snapshot-every"}, {"keep_checkpoints", "keep-checkpoints"},
      {"model.layers", "layers"},   {"model.d_model", "d-model"}, {"model.heads", "heads"},
      {"model.d_head", "d-head"},   {"model.kv_heads", "kv-heads"}, {"n", "n"},
      {"model.max_len", "max-len"}, {"model.causal_layers", "attention"}, {"encoder_layers", "encoder-layers"},
      {"max_source_len", "max-len"}, {"model.scale", "no-scale"}, {"model.embeddings", "embeddings"},
      {"model.qk", "qk"}, {"model.proj", "proj"}, {"model.d_mlp", "d-mlp"}, {"model.activation", "activation"},
      {"model.layer_norm", "no-layer-norm"}, {"model.attention_bias", "no-attention-bias"}, {"model.init", "init"},
      {"min_lr_ratio", "min-lr-ratio"}, {"weight_decay", "weight-decay"}, {"beta2", "beta2"}, {"clip", "clip"},
      {"train_fraction", "train-fraction"}, {"log_every", "log-every"}};
  const auto it = options.find(field);
  return it == options.end() ? "" : it->second;
}

}  // namespace qkv::training
