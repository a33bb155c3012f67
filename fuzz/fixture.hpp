#pragma once
// The run the checkpoint fuzzer and its corpus share: a one-layer bracket model with d_model 4,
// and its Adam optimizer after one step, with the bytes of its three files.
#include <memory>
#include <string>

#include "qkv/optim/adam.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/training/checkpoint.hpp"

namespace qkv::fuzz {

struct Fixture {
  Fixture();
  tasks::TrainOptions options;
  std::unique_ptr<nn::Transformer> model;
  std::unique_ptr<optim::Adam> optimizer;
  training::CheckpointCheck check;  // what its checkpoint must hold: every parameter has a step's state
  // The valid files of the run.
  std::string config, model_file, optimizer_file;
};

}  // namespace qkv::fuzz
