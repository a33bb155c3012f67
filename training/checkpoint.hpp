#pragma once
// A training run's checkpoint (nn/checkpoint.hpp) as `qkv train` writes it: the model, Adam's
// state, and the state of the generator that draws the training batches ("rng" in the optimizer
// file's metadata), so that a resumed run continues bit-identically. DIR/config.json, written when
// the run starts, says how to rebuild the model and the schedule.
#include <cstddef>
#include <optional>
#include <vector>

#include "qkv/core/random.hpp"
#include "qkv/nn/checkpoint.hpp"
#include "qkv/optim/optimizer.hpp"

namespace qkv::training {

struct CheckpointState {
  std::size_t step = 0;       // optimizer steps taken
  Generator::State rng{};     // of the training batches, after `step` steps
  // The step the run's target checks (TrainOptions::target_every) first passed, if one did by
  // `step` ("steps_to_target" in the metadata), so that a resumed run reports it.
  std::optional<std::size_t> steps_to_target{};
};

// What a checkpoint of a given run must hold, beyond fitting the model and the optimizer.
struct CheckpointCheck {
  std::size_t max_step = 0;    // the run's steps: a checkpoint past them is refused
  std::vector<bool> updated;   // per parameter: whether a training step updates it (and so has
                               // optimizer state from step 1 on); empty: not checked
};

void save_checkpoint(const std::string& dir, const nn::Module& model, const optim::Optimizer& optimizer,
                     const CheckpointState& state);

// Loads a checkpoint into `model` and `optimizer`; throws std::runtime_error naming the file and
// the fault (names or shapes that do not fit the model, optimizer state missing or unknown, no
// generator state, a step out of range).
CheckpointState restore_checkpoint(const nn::Checkpoint& checkpoint, nn::Module& model, optim::Optimizer& optimizer,
                                   const CheckpointCheck& check);

}  // namespace qkv::training
