#pragma once
// The run the checkpoint fuzzer and its corpus share: a one-layer bracket model with d_model 4,
// and its Adam optimizer after one step, with the bytes of its three files.
#include <memory>
#include <string>

#include "qkv/training/checkpoint.hpp"
#include "qkv/training/train.hpp"
#include "qkv/optim/adam.hpp"

namespace qkv::fuzz {

struct Fixture {
  Fixture();
  cli::TrainOptions options;
  std::unique_ptr<nn::Transformer> model;
  std::unique_ptr<optim::Adam> optimizer;
  cli::CheckpointCheck check;  // what its checkpoint must hold: every parameter has a step's state
  // The valid files of the run.
  std::string config, model_file, optimizer_file;
};

}  // namespace qkv::fuzz
