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
}  // namespace qkv::training
