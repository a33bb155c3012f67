#pragma once
// `qkv train TASK`: Adam with warmup + cosine and gradient clipping, evaluated on fresh
// held-out sequences.
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "examples/model.hpp"

namespace qkv::examples {

struct TrainOptions {
  std::string task;
  std::string out;  // run folder; "" means runs/TASK
  std::uint64_t seed = 0;
  std::size_t steps = 2000, batch = 32, warmup = 100, log_every = 100;
  double lr = 3e-3, min_lr_ratio = 0.1, weight_decay = 0, clip = 1.0;
  std::size_t eval_batches = 32;  // of `batch` fresh sequences each
  std::size_t checkpoint_every = 500;  // and at the end
  std::size_t stop_after = 0;  // stop (checkpointed) after this step, to resume later; 0: run to the end
  bool resume = false;         // continue the run in `out` from its checkpoint
  // Every `target_every` steps (0: never), accuracy on `target_batches` held-out batches; the
  // first step where it reaches `target` is TrainResult::steps_to_target.
  double target = 0;
  std::size_t target_every = 0, target_batches = 4;
  ModelConfig model;
};

// The text of the config.json that records `options`.
std::string config_text(const TrainOptions& options);
// The options a run folder's config.json records; throws std::runtime_error naming the file.
TrainOptions read_config(const std::string& dir);
// The same from the text of a config.json; `file` names it in messages.
TrainOptions parse_config(std::string_view text, const std::string& file);

// The defaults of each task, with which `qkv train TASK` reaches the task's target.
TrainOptions default_options(const std::string& task);

struct TrainResult {
  Metrics eval;  // on held-out sequences
  std::size_t steps = 0;
  double seconds = 0;
  std::optional<double> loss;  // mean of the last logging window; none when no step ran
  std::optional<std::size_t> steps_to_target;  // with TrainOptions::target_every
};

// The accuracy each task's defaults must reach on held-out sequences: 0.99, 0.99, 0.95.
double task_target(const std::string& task);

// Trains, writes OUT/config.json, OUT/metrics.jsonl and checkpoints (see checkpoint.hpp), and shows
// progress on `progress` (an in-place line when `tty`, else a line per log step). A resumed run
// ends with weights bit-identical to those of an uninterrupted one.
TrainResult train(const TrainOptions& options, std::ostream& progress, bool tty);

// The model of a run folder: rebuilt from config.json, with the weights of model.safetensors.
// Throws std::runtime_error naming the file at fault.
std::unique_ptr<Model> load_model(const std::string& dir);

// Accuracy of `model` on `batches` fresh batches drawn from `seed`.
Metrics evaluate(const Model& model, const Task& task, std::size_t batches, std::size_t batch_size, std::uint64_t seed);

}  // namespace qkv::examples
