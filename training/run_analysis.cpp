#include "qkv/training/run_analysis.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "qkv/analysis/history.hpp"
#include "qkv/core/shape.hpp"
#include "qkv/nn/detail/json.hpp"
#include "qkv/nn/checkpoint.hpp"
#include "qkv/nn/files.hpp"
#include "qkv/nn/generate.hpp"
#include "qkv/report/explore.hpp"
#include "qkv/tasks/evaluate.hpp"
#include "qkv/tasks/builtin.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/tasks/vocabulary_task.hpp"
#include "qkv/training/kept_checkpoints.hpp"
#include "qkv/training/options.hpp"
#include "qkv/training/run_folder.hpp"

namespace qkv::training {

using namespace tasks;

namespace {

// A run folder's config.json, and whether it is a qkv train run's (it names a "task", which must
// then be a registered one) or a library program's (no "task": its task is the program's own).
struct RunConfig {
  nlohmann::json json;
  bool names_task = false;
};

RunConfig run_config(const std::string& dir) {
  const std::string file = dir + "/config.json";
  RunConfig c{nn::detail::parse_json(nn::read_file(file, 1 << 20), file, 3)};
  c.names_task = c.json.is_object() && c.json.contains("task");
  return c;
}

// The token names a library run's config.json saved ("tokens": a name a token id), or none. Each
// must be printable text of 1 to 40 bytes without spaces, unique, and not another token's id.
std::vector<std::string> saved_token_names(const nlohmann::json& config, std::size_t vocab, const std::string& file) {
  std::vector<std::string> names;
  if (!config.is_object() || !config.contains("tokens")) return names;
  const auto bad = [&](const std::string& why) {
    throw std::runtime_error(fmt::format("{}: 'tokens'{}", file, why));
  };
  const nlohmann::json& tokens = config["tokens"];
  if (!tokens.is_array()) bad(" must be a list of names, one a token id");
  if (tokens.size() != vocab) bad(fmt::format(" holds {} names for a vocabulary of {}", tokens.size(), vocab));
  for (std::size_t id = 0; id < tokens.size(); ++id) {
    const nlohmann::json& t = tokens[id];
    if (!t.is_string()) bad(fmt::format("[{}] is {}, not a name", id, t.dump()));
    const std::string name = t.get<std::string>();
    const bool printable = std::all_of(name.begin(), name.end(), [](char ch) {
      return static_cast<unsigned char>(ch) > 0x20 && ch != 0x7f;
    });
    if (name.empty() || name.size() > 40 || !printable)
      bad(fmt::format("[{}] must be 1 to 40 bytes of printable text without spaces", id));
    const auto number = parse_count(name);
    if (number && *number != id) bad(fmt::format("[{}] is '{}', the id of another token", id, name));
    if (std::find(names.begin(), names.end(), name) != names.end()) bad(fmt::format("[{}] '{}' names two tokens", id, name));
    names.push_back(name);
  }
  return names;
}

// The run's options; a library program's run is refused for `what` (an evaluation, an ablation):
// without its task there are no sequences to draw.
const TrainOptions& options_of(const RunInfo& run, const char* what) {
  if (run.library_run())
    throw std::runtime_error(fmt::format("{}/config.json: names no task (a library program's run), so there are no "
                                         "sequences for {}: give its sequences as a data file (--data), or score "
                                         "it with tasks::evaluate and its own task",
                                         run.dir, what));
  return *run.options;
}

// The model of a decoder-only run, a library program's too, and whether it masks padding keys; an
// encoder-decoder is refused for `what`.
struct DecoderRun {
  std::unique_ptr<nn::Transformer> model;
  bool mask_padding = true;
};

DecoderRun decoder_run(const RunInfo& run, const char* what) {
  if (run.library_run()) return {nn::load_transformer(run.dir), true};
  if (run.options->encoder_layers)
    throw std::runtime_error(fmt::format("{}: a {} run, whose model is an encoder-decoder: {} reads decoder-only "
                                         "models (inspection shows its cross-attention)",
                                         run.dir, run.options->task, what));
  return {load_model(run.dir), run.options->mask_padding};
}

}  // namespace

RunInfo open_run(const std::string& dir) {
  const RunConfig c = run_config(dir);
  RunInfo run{.dir = dir, .task = nullptr, .options = std::nullopt};
  if (c.names_task) {
    const TrainOptions& o = run.options.emplace(read_config(dir));
    run.task = make_task(o);
    run.input_positions = o.encoder_layers ? o.max_source_len : o.model.max_len;  // a model may have more (--max-len)
    return run;
  }
  const nn::TransformerConfig model = nn::load_config(dir);
  run.task = std::make_unique<VocabularyTask>("run", model, saved_token_names(c.json, model.vocab_size, dir + "/config.json"));
  run.input_positions = model.max_len;
  return run;
}

std::unique_ptr<Task> run_task(const std::string& dir) { return open_run(dir).task; }

std::vector<std::int64_t> parse_input(const RunInfo& run, const std::string& text) {
  return encode_input(*run.task, text, run.input_positions);
}

namespace {

// A bad option of qkv generate: a bad command line.
template <class... Args>
[[noreturn]] void bad_option(const std::string& option, fmt::format_string<Args...> text, Args&&... args) {
  throw UsageError(fmt::format("{}: {}", option, fmt::format(text, std::forward<Args>(args)...)));
}

nn::Sampling sampling(const GenerateOptions& g) {
  if (!(g.temperature >= 0) || !std::isfinite(g.temperature))
    bad_option("--temperature", "is {}; it must be 0 or more", g.temperature);
  if (g.top_k > 0 && g.temperature == 0) bad_option("--top-k", "needs --temperature: greedy decoding takes the likeliest token");
  return {.temperature = g.temperature, .top_k = g.top_k};
}

std::vector<std::int64_t> input_of(const Task& task, const std::string& text, std::size_t positions) {
  try {
    return encode_input(task, text, positions);
  } catch (const std::invalid_argument& e) {
    bad_option("--input", "{}", e.what());
  }
}

}  // namespace

std::string generate_run(const std::string& dir, const std::string& text, const GenerateOptions& g) {
  const RunInfo run = open_run(dir);
  const std::string name = run.library_run() ? "run" : run.options->task;
  if (const Seq2SeqTask* seq2seq = as_seq2seq(*run.task)) {  // the output for the source, up to its end token
    const auto model = load_encoder_decoder(dir);
    const nn::EncoderDecoderConfig& c = model->config();
    const std::vector<std::int64_t> source = input_of(*seq2seq, text, c.max_src_len);
    const std::size_t count = g.tokens.value_or(c.max_tgt_len);
    if (count > c.max_tgt_len) bad_option("--tokens", "{} pass the decoder's {} positions", count, c.max_tgt_len);
    Generator gen(g.seed);
    const IndexArray out = nn::generate(*model, one_row(source), seq2seq->sides().start, count, sampling(g), gen, g.cache);
    return seq2seq->decode(std::vector<std::int64_t>(out.begin(), out.end()));
  }
  const auto model = run.library_run() ? nn::load_transformer(dir) : load_model(dir);
  const nn::TransformerConfig& c = model->config();
  // A run that cannot generate is the wrong run for the command: a bad command line.
  if (c.readout != nn::Readout::token || c.n_classes != c.vocab_size)
    throw UsageError(fmt::format("{}: a {} model predicts {}, not the next token: it cannot generate", dir, name,
                                 c.readout == nn::Readout::token ? "a class per position" : "positions"));
  try {
    model->check_decodable();  // the library's check, named with the run
  } catch (const std::invalid_argument& e) {
    throw UsageError(fmt::format("{}: {}", dir, e.what()));
  }
  const std::vector<std::int64_t> input = input_of(*run.task, text, c.max_len);
  if (input.size() == c.max_len)
    bad_option("--input", "{} tokens leave none of the model's {} positions to generate", input.size(), c.max_len);
  const std::size_t count = g.tokens.value_or(c.max_len - input.size());
  if (input.size() + count > c.max_len)
    bad_option("--tokens", "{} after {} input tokens pass the model's {} positions", count, input.size(), c.max_len);
  const nn::Sampling s = sampling(g);
  Generator gen(g.seed);
  const IndexArray out = nn::generate(*model, one_row(input), count, s, gen, g.cache);
  return run.task->decode(std::vector<std::int64_t>(out.begin(), out.end()));
}

void save_model_config(const std::string& dir, const nn::TransformerConfig& config, const std::vector<std::string>& token_names) {
  nlohmann::json j = {{"model", nlohmann::json::parse(nn::to_json(config))}};
  if (!token_names.empty()) j["tokens"] = token_names;
  const std::string file = dir + "/config.json";
  try {
    saved_token_names(j, config.vocab_size, file);
  } catch (const std::runtime_error& e) {
    throw std::invalid_argument(e.what());
  }
  nn::write_atomically(file, j.dump(2) + "\n");
}

nlohmann::json evaluate_run(const std::string& dir, std::size_t n, std::uint64_t seed) {
  const RunInfo run = open_run(dir);
  const TrainOptions& o = options_of(run, "an evaluation");
  const Task* task = run.task.get();
  if (const Split* split = task->split()) {  // a data-set task: its held-out split and its training one, whole
    const auto model = load_model(dir);
    const RowsScore test = score_rows(*model, *task, split->test, o.mask_padding);
    const RowsScore train = score_rows(*model, *task, split->train, o.mask_padding);
    return {{"task", o.task}, {"dir", dir}, {"sequences", test.metrics.sequences}, {"accuracy", test.metrics.accuracy},
            {"exact_match", test.metrics.exact_match}, {"loss", test.loss},
            {"train", {{"sequences", train.metrics.sequences}, {"accuracy", train.metrics.accuracy}, {"loss", train.loss}}}};
  }
  const std::size_t batches = (n + o.batch - 1) / o.batch;
  nlohmann::json out = {{"task", o.task}, {"dir", dir}, {"sequences", batches * o.batch}, {"seed", seed}};
  if (const Seq2SeqTask* seq2seq = as_seq2seq(*task)) {
    const auto model = load_encoder_decoder(dir);
    const Metrics forced = evaluate(*model, *task, batches, o.batch, seed);
    const Metrics written = evaluate_generation(*model, *seq2seq, batches, o.batch, seed);
    out.update({{"accuracy", forced.accuracy}, {"exact_match", forced.exact_match},
                {"generated", {{"accuracy", written.accuracy}, {"exact_match", written.exact_match}}}});
    return out;
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
  return out;
}

nlohmann::json evaluate_run(const std::string& dir, const std::string& data) {
  const RunInfo run = open_run(dir);
  const DecoderRun r = decoder_run(run, "an evaluation on a data file");
  const Dataset d = read_dataset(data, *run.task, run.input_positions);
  const Metrics m = evaluate(*r.model, *run.task, d, r.mask_padding);
  return {{"task", run.task->info().name}, {"dir", dir},           {"data", data},
          {"sequences", d.sequences()},    {"accuracy", m.accuracy}, {"exact_match", m.exact_match}};
}

analysis::Ablation ablate_run(const std::string& dir, std::size_t n, std::uint64_t seed) {
  const RunInfo run = open_run(dir);
  const TrainOptions& o = options_of(run, "an ablation");
  const DecoderRun r = decoder_run(run, "ablation");
  // A full-batch run (batch 0) is ablated in batches of 256 of its held-out rows.
  const std::size_t batch = o.batch ? o.batch : 256;
  analysis::Ablation a =
      analysis::ablate(*r.model, *run.task, task_spec(o.task).corruption, (n + batch - 1) / batch, batch, seed, o.mask_padding);
  a.dir = dir;
  return a;
}

namespace {

// `analyse(model, task, corruption, options)` on a decoder-only run of a task with a corrupted
// input, masking padding keys as the run trained; the result names the run.
template <class Options, class Analyse>
auto on_corrupted_run(const std::string& dir, const char* what, Options options, Analyse analyse) {
  const RunInfo run = open_run(dir);
  const TrainOptions& o = options_of(run, what);
  const DecoderRun r = decoder_run(run, what);
  const std::optional<tasks::Corruption>& corruption = task_spec(o.task).corruption;
  if (!corruption)
    throw std::runtime_error(fmt::format("{}: the task {} has no corrupted input to patch from (induction has one)", dir, o.task));
  options.mask_padding = o.mask_padding;
  auto result = analyse(*r.model, *run.task, *corruption, options);
  result.dir = dir;
  return result;
}

}  // namespace

analysis::Patching patch_run(const std::string& dir, bool attribution, analysis::PatchOptions options) {
  return on_corrupted_run(dir, "patching", options, [attribution](nn::Transformer& model, const tasks::Task& task,
                                                                  const tasks::Corruption& corruption, const analysis::PatchOptions& o) {
    return attribution ? analysis::attribution_patch(model, task, corruption, o) : analysis::patch(model, task, corruption, o);
  });
}

analysis::PathPatching path_patch_run(const std::string& dir, analysis::PathPatchOptions options) {
  return on_corrupted_run(dir, "path patching", options, [](nn::Transformer& model, const tasks::Task& task,
                                                            const tasks::Corruption& corruption, const analysis::PathPatchOptions& o) {
    return analysis::path_patch(model, task, corruption, o);
  });
}

analysis::LogitAttribution logit_attribution_run(const std::string& dir, analysis::LogitAttributionOptions options) {
  const RunInfo run = open_run(dir);
  const TrainOptions& o = options_of(run, "logit attribution");
  const DecoderRun r = decoder_run(run, "logit attribution");
  if (r.model->config().readout != nn::Readout::token)
    throw std::runtime_error(fmt::format("{}: the task {} reads out with the pointer readout (attention scores); direct logit "
                                         "attribution needs the token readout",
                                         dir, o.task));
  options.mask_padding = o.mask_padding;
  return analysis::logit_attribution(*r.model, *run.task, options);
}

analysis::AcrossTraining across_training_run(const std::string& dir, analysis::MeasureOptions options) {
  const RunInfo run = open_run(dir);
  const TrainOptions& o = options_of(run, "inspect --across-training");
  const DecoderRun r = decoder_run(run, "inspect --across-training");
  const auto kept = kept_checkpoints(dir);
  if (kept.empty())
    throw std::runtime_error(fmt::format("{}: the run kept no checkpoints along training (train it with --keep-checkpoints "
                                         "log or every:N)",
                                         dir));
  options.mask_padding = o.mask_padding;
  analysis::AcrossTraining a{.task = o.task, .dir = dir, .sequences = options.sequences, .seed = options.seed, .checkpoints = {}};
  for (const auto& [step, path] : kept) {
    nn::load_weights(nn::load_safetensors(path), path, *r.model);
    a.checkpoints.push_back(analysis::measure_checkpoint(*r.model, *run.task, task_spec(o.task).corruption, step, options));
  }
  return a;
}

analysis::FourierRun fourier_run(const std::string& dir, const analysis::FourierOptions& options) {
  const RunInfo run = open_run(dir);
  const auto* modadd = dynamic_cast<const tasks::ModAddTask*>(run.task.get());
  if (!modadd)
    throw std::invalid_argument(fmt::format("{}: a {} run: the Fourier analysis reads a model of modular addition (the "
                                            "modadd task)",
                                            dir, run.task->info().name));
  const auto model = load_model(dir);
  analysis::FourierRun r{.dir = dir, .final = analysis::fourier_analysis(*model, *modadd, options), .steps = {}, .along = {}};
  analysis::FourierOptions along = options;
  along.key_frequencies = r.final.key_frequencies;  // the final ones, even none
  for (const auto& [step, path] : kept_checkpoints(dir)) {
    nn::load_weights(nn::load_safetensors(path), path, *model);
    r.steps.push_back(step);
    r.along.push_back(analysis::fourier_analysis(*model, *modadd, along));
  }
  return r;
}

analysis::Ablation ablate_run(const std::string& dir, const std::string& data) {
  const RunInfo run = open_run(dir);
  const DecoderRun r = decoder_run(run, "ablation");
  analysis::Ablation a = analysis::ablate(*r.model, *run.task, read_dataset(data, *run.task, run.input_positions), r.mask_padding);
  a.dir = dir;
  return a;
}

std::vector<analysis::StepAttention> attention_along_training(const std::string& dir, const std::vector<std::int64_t>& input,
                                                               const analysis::TrainingHistory& history) {
  std::vector<analysis::StepAttention> steps;
  if (const auto kept = kept_checkpoints(dir); !kept.empty()) {
    const auto model = load_model(dir);
    const nn::TransformerConfig& c = model->config();
    for (const std::size_t i : report::explore_steps(kept.size(), report::explore_bytes_per_step(c.layers, c.heads, input.size()))) {
      nn::load_weights(nn::load_safetensors(kept[i].second), kept[i].second, *model);
      steps.push_back(analysis::attention_at_step(*model, input, kept[i].first));
    }
    return steps;
  }
  for (const auto& snap : history.snapshots)
    if (snap.input == input) steps.push_back({.step = snap.step, .attention = snap.attention, .sigma = snap.sigma});
  return steps;
}

RunInspection inspect_run(const RunInfo& run, const std::optional<std::vector<std::int64_t>>& input, bool history,
                          bool along_training) {
  const std::string& dir = run.dir;
  if (run.library_run()) {  // its model and the tokens given
    if (!input)
      throw std::invalid_argument(fmt::format("{}: a library program's run (its config.json names no task): the input "
                                              "must be given, as token ids or the token names it saved",
                                              dir));
    const auto model = nn::load_transformer(dir);
    analysis::Inspection in = analysis::inspect(*model, *run.task, *input, dir);
    if (history) in.history = analysis::read_history(dir, model->config());
    return in;
  }
  const TrainOptions& o = *run.options;
  if (const Seq2SeqTask* seq2seq = as_seq2seq(*run.task)) {
    const auto model = load_encoder_decoder(dir);
    analysis::AlignmentInspection in =
        analysis::inspect_alignment(*model, *seq2seq, input ? *input : analysis::typical_source(*seq2seq), dir);
    if (history) in.history = analysis::read_history(dir, o.model);
    return in;
  }
  const auto model = load_model(dir);
  analysis::Inspection in = analysis::inspect(*model, *run.task, input ? *input : analysis::typical_input(*run.task), dir);
  if (history) in.history = analysis::read_history(dir, o.model);
  if (along_training) {
    in.along_training = attention_along_training(dir, in.input, in.history);
    if (!in.along_training.empty()) in.along_training_from = kept_checkpoints(dir).empty() ? "snapshots" : "kept checkpoints";
  }
  return in;
}

RunInspection inspect_run(const std::string& dir, const std::optional<std::vector<std::int64_t>>& input, bool history,
                          bool along_training) {
  return inspect_run(open_run(dir), input, history, along_training);
}

}  // namespace qkv::training
