#pragma once
// Checkpoints kept along training, for analysis after it: `qkv train --keep-checkpoints log|every:N`
// writes the model's weights (no optimizer state) at step 0, at the kept steps and at the last step
// as OUT/checkpoints/step-00001000.safetensors, each atomically. `qkv inspect DIR --across-training`
// reads them back (run_analysis.hpp). The run's own checkpoints (checkpoint.hpp), which a resume
// reads, are apart and unchanged.
//
//   log       ten steps a decade from 10 on: round(10^(i/10)), i = 10, 11, …: 10, 13, 16, 20, 25,
//             32, 40, 50, 63, 79, 100, 126, …
//   every:N   every N steps
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "qkv/nn/module.hpp"
#include "qkv/tasks/train_options.hpp"

namespace qkv::training {

struct KeepSchedule {
  bool log = false;
  std::size_t every = 0;
  // Whether a run of `steps` steps keeps the weights after `step` steps: 0, the last, and the
  // schedule's.
  bool due(std::size_t step, std::size_t steps) const;
  // Every step a run of `steps` steps keeps, in order.
  std::vector<std::size_t> steps(std::size_t steps) const;
};

// "log" or "every:N" (N from 1 to max_steps); none for "". Anything else throws OptionError naming
// keep_checkpoints.
std::optional<KeepSchedule> keep_schedule(const std::string& text);

// The bounds of a kept series: a run whose schedule would keep more checkpoints, or more bytes of
// weights, is refused before it starts (OptionError naming keep_checkpoints, with both counts).
inline constexpr std::size_t max_kept_checkpoints = 1000;
inline constexpr double max_kept_bytes = 1024.0 * 1024 * 1024;
void check_kept_checkpoints(const tasks::TrainOptions& options);

// DIR/checkpoints/step-STEP.safetensors (STEP zero-padded to 8 digits).
std::string kept_checkpoint_path(const std::string& dir, std::size_t step);
// Writes the model's weights there (atomically), with its step in the file's metadata.
void keep_checkpoint(const std::string& dir, std::size_t step, const nn::Module& model);
// Removes what a keep that died left: DIR/checkpoints/step-*.safetensors.tmp.
void remove_partial_kept(const std::string& dir);
// The kept checkpoints of DIR, by step: (step, path); none without DIR/checkpoints.
std::vector<std::pair<std::size_t, std::string>> kept_checkpoints(const std::string& dir);

}  // namespace qkv::training
