#include "qkv/training/run_analysis.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "qkv/analysis/history.hpp"
#include "qkv/nn/detail/json.hpp"
#include "qkv/nn/files.hpp"
#include "qkv/tasks/evaluate.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/tasks/vocabulary_task.hpp"
#include "qkv/training/options.hpp"
#include "qkv/training/run_folder.hpp"

namespace qkv::training {

using namespace tasks;

namespace {

// A run folder's config.json as JSON, and the registered task it names, if any.
struct RunConfig {
  nlohmann::json json;
  std::optional<std::string> task;
};

RunConfig run_config(const std::string& dir) {
  const std::string file = dir + "/config.json";
  RunConfig c{nn::detail::parse_json(nn::read_file(file, 1 << 20), file, 3), std::nullopt};
  if (c.json.is_object() && c.json.contains("task") && c.json["task"].is_string()) {
    const std::vector<std::string> known = task_names();
    const std::string name = c.json["task"].get<std::string>();
    if (std::find(known.begin(), known.end(), name) != known.end()) c.task = name;
  }
  return c;
}

// The name a run of a task qkv does not know goes by: its config.json's "task", or "run".
std::string unknown_task_name(const nlohmann::json& config) {
  return config.is_object() && config.contains("task") && config["task"].is_string() ? config["task"].get<std::string>()
                                                                                     : std::string("run");
}

// The token names a run's config.json saved ("tokens": a string a token id), or none.
std::vector<std::string> saved_token_names(const nlohmann::json& config) {
  std::vector<std::string> names;
  if (!config.is_object() || !config.contains("tokens") || !config["tokens"].is_array()) return names;
  for (const nlohmann::json& t : config["tokens"]) {
    if (!t.is_string()) return {};
    names.push_back(t.get<std::string>());
  }
  return names;
}

// Refuses a run of a task qkv does not know for `what` (evaluation, ablation): it has no sequences.
void check_known_task(const std::string& dir, const char* what) {
  const RunConfig c = run_config(dir);
  if (!c.task)
    throw std::runtime_error(fmt::format("{}/config.json: names no task qkv knows ('{}'), so there are no sequences for "
                                         "{}: inspect it on an input of its tokens, or score it with tasks::evaluate "
                                         "and its own task",
                                         dir, unknown_task_name(c.json), what));
}

}  // namespace

std::unique_ptr<Task> run_task(const std::string& dir) {
  const RunConfig c = run_config(dir);
  if (c.task) {
    const TrainOptions o = read_config(dir);
    return make_task(o.task, o.n);
  }
  const nn::TransformerConfig model = nn::load_config(dir);
  const std::vector<std::string> names = saved_token_names(c.json);
  if (!names.empty() && names.size() != model.vocab_size)
    throw std::runtime_error(fmt::format("{}/config.json: 'tokens' holds {} names for a vocabulary of {}", dir,
                                         names.size(), model.vocab_size));
  return std::make_unique<VocabularyTask>(unknown_task_name(c.json), model, names);
}

nlohmann::json evaluate_run(const std::string& dir, std::size_t n, std::uint64_t seed) {
  check_known_task(dir, "an evaluation");
  const TrainOptions o = read_config(dir);
  const auto task = make_task(o.task, o.n);
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

analysis::Ablation ablate_run(const std::string& dir, std::size_t n, std::uint64_t seed) {
  check_known_task(dir, "an ablation");
  const TrainOptions o = read_config(dir);
  if (o.encoder_layers)
    throw std::runtime_error(fmt::format("{}: a {} run, whose model is an encoder-decoder: ablation reads decoder-only "
                                         "models (inspection shows its cross-attention)",
                                         dir, o.task));
  const auto model = load_model(dir);
  const auto task = make_task(o.task, o.n);
  analysis::Ablation a =
      analysis::ablate(*model, *task, task_spec(o.task).corruption, (n + o.batch - 1) / o.batch, o.batch, seed, o.mask_padding);
  a.dir = dir;
  return a;
}

RunInspection inspect_run(const std::string& dir, const std::optional<std::vector<std::int64_t>>& input, bool history) {
  if (!run_config(dir).task) {  // a run of its own task: its model and the tokens given
    const std::unique_ptr<Task> task = run_task(dir);
    if (!input)
      throw std::invalid_argument(fmt::format("{}: a run of a task qkv does not know ('{}'): its input must be given "
                                              "(as token ids or the token names it saved)",
                                              dir, task->info().name));
    const auto model = nn::load_transformer(dir);
    analysis::Inspection in = analysis::inspect(*model, *task, *input, dir);
    if (history) in.history = analysis::read_history(dir, model->config());
    return in;
  }
  const TrainOptions o = read_config(dir);
  const auto task = make_task(o.task, o.n);
  if (const Seq2SeqTask* seq2seq = as_seq2seq(*task)) {
    const auto model = load_encoder_decoder(dir);
    analysis::AlignmentInspection in =
        analysis::inspect_alignment(*model, *seq2seq, input ? *input : analysis::typical_source(*seq2seq), dir);
    if (history) in.history = analysis::read_history(dir, o.model);
    return in;
  }
  const auto model = load_model(dir);
  analysis::Inspection in = analysis::inspect(*model, *task, input ? *input : analysis::typical_input(*task), dir);
  if (history) in.history = analysis::read_history(dir, o.model);
  return in;
}

}  // namespace qkv::training
