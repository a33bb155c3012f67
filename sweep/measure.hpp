#pragma once
// One run of a sweep (or of an experiment, which is a sweep with measurements of its own):
// trained, and measured along the way. Its numbers are those `qkv experiment` has always recorded:
// held-out accuracy, σ of the readout head's QK circuit, its score asymmetry and the task's probe
// at log-spaced steps (the curve), and at the end the steps to the task's target. A seq2seq run
// (an encoder-decoder) has the same but the probe, with σ the mean over the last decoder layer's
// cross-attention heads and no score asymmetry (its scores are not square).
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/nn/seq2seq.hpp"
#include "qkv/nn/transformer.hpp"
#include "qkv/tasks/evaluate.hpp"
#include "qkv/tasks/task.hpp"
#include "qkv/tasks/train_options.hpp"

namespace qkv::sweep {

using tasks::Task;
using tasks::TrainOptions;

// Unpadded held-out sequences of a run's task, on which its σ, asymmetry and extras are measured.
using Sequences = std::vector<std::vector<std::int64_t>>;
// `n` of them, the same for a task and seed whatever else the run is.
using tasks::held_out_sequences;

// The steps at which a run's curve is measured: 0 (the init), 10, 20, 30, 50, 100, … (1, 2, 3, 5
// per decade) below `steps`, and `steps`.
std::vector<std::size_t> curve_steps(std::size_t steps);

// Measurements a run adds to the built-in ones (measurements.hpp): of the model at init (before
// training: the same init as train's) and of the trained one, into the run's JSON object.
struct Extras {
  std::function<void(nlohmann::ordered_json& run, nn::Transformer& init, const Task& task, const Sequences& sequences,
                     std::uint64_t seed)>
      at_init{};
  // The trained model is not const: a measurement may run it with hooks (they are removed after).
  std::function<void(nlohmann::ordered_json& run, nn::Transformer& trained, const Task& task, const Sequences& sequences)>
      at_end{};
  // A seq2seq run's, of the trained encoder-decoder. A measurement has this one alone, or the two
  // above alone: a sweep refuses it for the other kind of run.
  std::function<void(nlohmann::ordered_json& run, nn::EncoderDecoder& trained, const tasks::Seq2SeqTask& task)>
      seq2seq_at_end{};
  // A decoder-only run's folder once it trained, after at_end: what it kept along training.
  std::function<void(nlohmann::ordered_json& run, const std::string& dir)> of_folder{};
};

// Trains `options` (its out and seed set; a run already there is replaced when options.force) and
// adds to `run`, in this order: the extras at init, accuracy, steps_to_target, target, steps,
// seconds, sigma_init, sigma, score_asymmetry_init, score_asymmetry, the extras at the end, the
// probe's values at the end, curve (a point a curve step: step, accuracy, sigma, score_asymmetry,
// the probe's values) and config (config.json as train recorded it). A probe's broken bounds are
// appended to `violations`, each with its step. Progress goes to `progress` as train shows it
// (an in-place line when `tty`).
// With a `curve_file`, each point of the curve is appended to it as it is measured, with the
// probe's broken bounds at it; a resumed run (options.resume) takes the points of the steps before
// its checkpoint from that file and measures the rest (its seconds are those since it resumed).
void measure_run(nlohmann::ordered_json& run, const TrainOptions& options, const Extras& extras,
                 std::vector<std::string>& violations, std::ostream& progress, bool tty,
                 const std::string& curve_file = "");

// The step a run of `options` (its out set) that stopped part way would resume from: its folder's
// committed checkpoint, when the folder holds a run of the same options (but its steps) and
// `curve_file` holds the curve's points of every curve step up to it; none otherwise.
std::optional<std::size_t> resumable_step(const TrainOptions& options, const std::string& curve_file);

}  // namespace qkv::sweep
