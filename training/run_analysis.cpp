#include "qkv/training/run_analysis.hpp"

#include <fmt/format.h>

#include "qkv/analysis/history.hpp"
#include "qkv/tasks/evaluate.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/training/options.hpp"
#include "qkv/training/run_folder.hpp"

namespace qkv::training {

using namespace tasks;

nlohmann::json evaluate_run(const std::string& dir, std::size_t n, std::uint64_t seed) {
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
