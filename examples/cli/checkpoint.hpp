#pragma once
// A training checkpoint: model.safetensors (the model's state_dict) and optimizer.safetensors (the
// optimizer's state, with the step and the generator's state in its metadata), committed together
// as one checkpoint folder of the run (nn/checkpoint.hpp). DIR/config.json, written when the run
// starts, says how to rebuild the model and the schedule.
#include <cstddef>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "qkv/core/random.hpp"
#include "qkv/nn/module.hpp"
#include "qkv/nn/safetensors.hpp"
#include "qkv/optim/optimizer.hpp"

namespace qkv::cli {

struct CheckpointState {
  std::size_t step = 0;       // optimizer steps taken
  Generator::State rng{};     // of the training batches, after `step` steps
};

// What a checkpoint of a given run must hold, beyond fitting the model and the optimizer.
struct CheckpointCheck {
  std::size_t max_step = 0;    // the run's steps: a checkpoint past them is refused
  std::vector<bool> updated;   // per parameter: whether a training step updates it (and so has
                               // optimizer state from step 1 on); empty: not checked
};

void save_checkpoint(const std::string& dir, const nn::Module& model, const optim::Optimizer& optimizer,
                     const CheckpointState& state);

// Loads the committed checkpoint into `model` and `optimizer`; throws std::runtime_error naming
// the file and the fault (no checkpoint, unreadable files, names or shapes that do not fit the
// model, optimizer state missing or unknown, files from different steps, a step out of range).
CheckpointState load_checkpoint(const std::string& dir, nn::Module& model, optim::Optimizer& optimizer,
                                const CheckpointCheck& check);

// For a resume: the committed checkpoint or, when it cannot be loaded, the newest older one that
// can, which becomes the committed one; each one passed over is reported on `notes`. None when the
// run has no checkpoint; std::runtime_error, naming each checkpoint's fault, when none loads.
std::optional<CheckpointState> resume_checkpoint(const std::string& dir, nn::Module& model, optim::Optimizer& optimizer,
                                                 const CheckpointCheck& check, std::ostream& notes);

// The same from the two files of a checkpoint folder already parsed; `folder` names it in messages.
CheckpointState restore_checkpoint(const std::string& folder, const nn::Safetensors& model_file,
                                   const nn::Safetensors& optimizer_file, nn::Module& model,
                                   optim::Optimizer& optimizer, const CheckpointCheck& check);

}  // namespace qkv::cli
