#pragma once
// What the qkv program does with a run folder a training run wrote, as calls: its accuracy on fresh
// sequences (`qkv eval`), each head ablated (`qkv ablate`), and what its heads learned (`qkv
// inspect`). Each reads DIR/config.json and the committed checkpoint, and throws std::runtime_error
// naming the file at fault.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/analysis/ablate.hpp"
#include "qkv/analysis/across_training.hpp"
#include "qkv/analysis/fourier.hpp"
#include "qkv/analysis/logit_attribution.hpp"
#include "qkv/analysis/path_patching.hpp"
#include "qkv/analysis/patching.hpp"
#include "qkv/analysis/alignment.hpp"
#include "qkv/analysis/inspect.hpp"
#include "qkv/tasks/task.hpp"
#include "qkv/training/options.hpp"

namespace qkv::training {

// Accuracy and exact match on `n` fresh sequences (rounded up to whole batches of the run's batch)
// drawn from `seed`, as one JSON object: {task, dir, sequences, seed, accuracy, exact_match}, with
// for a seq2seq run `generated` (its outputs decoded greedily from the start token), and for a task
// with longer lengths (brackets: 26-40) `longer`, scored where the model has the positions. A
// library program's run (no task in its config.json) has no sequences to draw, and is refused:
// give it a data file, as below.
nlohmann::json evaluate_run(const std::string& dir, std::size_t n, std::uint64_t seed);

// Every head of a decoder-only run ablated in turn on `n` fresh sequences drawn from `seed` (as
// evaluate_run draws them), with the task's corruption when it has one. A seq2seq run, or a library
// program's (which has no sequences to draw: give it a data file), is refused.
analysis::Ablation ablate_run(const std::string& dir, std::size_t n, std::uint64_t seed);

// `qkv patch DIR`: analysis::patch (analysis::attribution_patch with `attribution`) on a
// decoder-only run with its task's corruption, masking padding keys as the run trained. A task
// without a corrupted input, a seq2seq run or a library program's run is refused, naming the run.
analysis::Patching patch_run(const std::string& dir, bool attribution, analysis::PatchOptions options);
// `qkv patch DIR --path`: analysis::path_patch on the run, with the same checks and refusals.
analysis::PathPatching path_patch_run(const std::string& dir, analysis::PathPatchOptions options);
// `qkv attribute DIR`: analysis::logit_attribution on a decoder-only run with the token readout
// (std::runtime_error naming the run otherwise), masking padding keys as the run trained.
analysis::LogitAttribution logit_attribution_run(const std::string& dir, analysis::LogitAttributionOptions options);
// The attention on `input` along training, for the page's slider: at each checkpoint the run kept
// (train --keep-checkpoints), or else at each snapshot of `history` that read the same input; none
// otherwise. Of many steps, those the page keeps alone (report::explore_steps): only they are
// loaded.
std::vector<analysis::StepAttention> attention_along_training(const std::string& dir, const std::vector<std::int64_t>& input,
                                                               const analysis::TrainingHistory& history);
// `qkv inspect DIR --across-training`: analysis::measure_checkpoint at each checkpoint the run kept
// (train --keep-checkpoints), patching where the task has a corrupted input, masking padding keys
// as the run trained. std::runtime_error naming the run when it kept none, or naming the file
// when one does not fit the run's model.
analysis::AcrossTraining across_training_run(const std::string& dir, analysis::MeasureOptions options = {});

// `qkv inspect DIR --fourier`: analysis::fourier_analysis of a modular-addition run's model and of
// each checkpoint it kept (none kept: the final model alone). std::invalid_argument naming the run
// and its task for any other task.
analysis::FourierRun fourier_run(const std::string& dir, const analysis::FourierOptions& options = {});

// The same on the sequences of a data file (tasks::read_dataset: JSON lines of tokens and targets,
// read as the run's tokens), for any decoder-only run, a library program's too: {task, dir, data,
// sequences, accuracy, exact_match}; and each head ablated on them, patched where the file gives
// corrupted tokens. An encoder-decoder run is refused.
nlohmann::json evaluate_run(const std::string& dir, const std::string& data);
analysis::Ablation ablate_run(const std::string& dir, const std::string& data);

// A run folder's config.json, read once: the run's task and, for a `qkv train` run, its options.
struct RunInfo {
  std::string dir;
  // The registered task config.json names (an unknown one is an error listing the known ones),
  // or, for a run whose config.json names no task (a library program's, written with
  // save_model_config or nn::save_config), a tasks::VocabularyTask "run" of its model's tokens,
  // named as config.json's "tokens" when it has them (one printable name a token id, each at most
  // 40 bytes).
  std::unique_ptr<tasks::Task> task;
  std::optional<TrainOptions> options;  // none for a library program's run
  // The most tokens an input may hold: the model's positions (a seq2seq run's: the source's).
  std::size_t input_positions = 0;
  bool library_run() const { return !options; }
};
RunInfo open_run(const std::string& dir);
// open_run(dir).task.
std::unique_ptr<tasks::Task> run_task(const std::string& dir);

// `text` as the run's tokens (names, or for a library program's run names or ids), at most its
// input_positions: std::invalid_argument naming the fault.
std::vector<std::int64_t> parse_input(const RunInfo& run, const std::string& text);

// What the heads of a run learned on `input` (token ids; none: the task's typical input, or a
// seq2seq task's typical source), with the run's training history when `history`, and with
// `along_training` the attention along training (attention_along_training, for the page): an
// Inspection, or for a seq2seq run an AlignmentInspection. A library program's run needs `input`.
// What `qkv inspect DIR` shows is report::print_report, to_json, to_html or write_svgs of it.
using RunInspection = std::variant<analysis::Inspection, analysis::AlignmentInspection>;
RunInspection inspect_run(const RunInfo& run, const std::optional<std::vector<std::int64_t>>& input, bool history,
                          bool along_training = false);
RunInspection inspect_run(const std::string& dir, const std::optional<std::vector<std::int64_t>>& input, bool history,
                          bool along_training = false);

// `qkv generate DIR --input TEXT`: what a run writes after `input` (the run's text: its task's, or
// a library program's token names or ids): the input continued, for a run whose model predicts the
// next token; a seq2seq run's output for the source `input`, up to its end token. As text.
struct GenerateOptions {
  std::optional<std::size_t> tokens{};  // to generate; none: up to the model's positions
  bool cache = true;                    // the KV cache; without it the model reads the whole sequence a step
  double temperature = 0;               // 0: greedy
  std::size_t top_k = 0;                // with a temperature: among the k likeliest (0: all)
  std::uint64_t seed = 0;               // of the sampling
};
// Throws UsageError naming the option at fault ("--input", "--tokens", "--temperature", "--top-k")
// or, for a run whose model does not predict the next token, the run.
std::string generate_run(const std::string& dir, const std::string& input, const GenerateOptions& options = {});

// DIR/config.json of a library program's run, written atomically: {"model": CONFIG} and, when
// given, "tokens": a name for each token id, which inspect_run's pages and tables then show (and
// parse_input reads). Names are checked as open_run checks them: std::invalid_argument naming the
// one at fault.
void save_model_config(const std::string& dir, const nn::TransformerConfig& config,
                       const std::vector<std::string>& token_names = {});

}  // namespace qkv::training
