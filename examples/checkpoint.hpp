#pragma once
// A training checkpoint in a run folder: DIR/model.safetensors (the model's state_dict) and
// DIR/optimizer.safetensors (the optimizer's state, with the step and the generator's state in
// its metadata), each written atomically. DIR/config.json, written when the run starts, says
// how to rebuild the model and the schedule.
#include <cstddef>
#include <string>

#include "core/random.hpp"
#include "nn/module.hpp"
#include "nn/safetensors.hpp"
#include "optim/optimizer.hpp"

namespace qkv::examples {

struct CheckpointState {
  std::size_t step = 0;       // optimizer steps taken
  Generator::State rng{};     // of the training batches, after `step` steps
};

void save_checkpoint(const std::string& dir, const nn::Module& model, const optim::Optimizer& optimizer,
                     const CheckpointState& state);
// Loads into `model` and `optimizer`; throws std::runtime_error naming the file and the fault
// (unreadable files, names or shapes that do not fit the model, files from different steps).
CheckpointState load_checkpoint(const std::string& dir, nn::Module& model, optim::Optimizer& optimizer);
// The same from the two files already parsed; `dir` names the folder in messages.
CheckpointState restore_checkpoint(const std::string& dir, const nn::Safetensors& model_file,
                                   const nn::Safetensors& optimizer_file, nn::Module& model,
                                   optim::Optimizer& optimizer);

}  // namespace qkv::examples
