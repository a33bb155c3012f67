#pragma once
// A short training run in a temporary folder of its own, for the tests of examples/.
#include <unistd.h>

#include <filesystem>
#include <string>

#include "examples/train.hpp"

namespace qkv::test {

inline examples::TrainOptions short_run(const std::string& task, const std::string& out, std::size_t steps = 30,
                                        std::size_t checkpoint_every = 500) {
  examples::TrainOptions o = examples::default_options(task);
  o.steps = steps;
  o.checkpoint_every = checkpoint_every;
  o.warmup = 5;
  o.log_every = 10;
  o.eval_batches = 2;
  o.out = (std::filesystem::temp_directory_path() / ("qkv_train_" + out + "_" + std::to_string(::getpid()))).string();
  return o;
}

}  // namespace qkv::test
