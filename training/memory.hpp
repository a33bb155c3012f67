#pragma once
// The memory a run needs, estimated from its options, and the check that refuses a run this machine
// cannot hold before anything is allocated.
#include "qkv/tasks/train_options.hpp"

namespace qkv::training {

using tasks::TrainOptions;

// The memory a run needs, in bytes, estimated from its options: the model with its gradients and
// Adam's state, and a training step's activations and their gradients.
struct MemoryEstimate {
  double model = 0, step = 0;
};
MemoryEstimate estimate_memory(const TrainOptions& options);

// Throws OptionError, naming the field to make smaller, when the model and a training step (or,
// without `training`, the weights and a forward pass) would need more memory than this machine
// has available (estimate_memory). train and load_model check it before they allocate anything.
void check_memory(const TrainOptions& options, bool training);
// From now on check_memory counts 1/processes of the memory this machine has available: for runs
// trained `processes` at once (qkv sweep -j). 1 restores the whole.
void share_memory(std::size_t processes);
}  // namespace qkv::training
