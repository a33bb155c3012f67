#pragma once
// A short training run in a temporary folder of its own, for the tests of the layers above nn.
#include <unistd.h>

#include <filesystem>
#include <string>

#include "tests/helpers.hpp"  // Catch2, after xarray.hpp

#include "qkv/tasks/evaluate.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/training/memory.hpp"
#include "qkv/training/metrics_log.hpp"
#include "qkv/training/options.hpp"
#include "qkv/training/run_folder.hpp"
#include "qkv/training/trainer.hpp"
#include "qkv/nn/safetensors.hpp"

namespace qkv::test {

// A folder under the system's temporary directory, unique to this process.
inline std::string temp_folder(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("qkv_" + name + "_" + std::to_string(::getpid()))).string();
}

// `n`: the task's size (0: its default), with the vocabulary and classes default_options derives from it.
inline tasks::TrainOptions short_run(const std::string& task, const std::string& out, std::size_t steps = 30,
                                        std::size_t checkpoint_every = 500, std::size_t n = 0) {
  tasks::TrainOptions o = tasks::default_options(task, n);
  o.steps = steps;
  o.checkpoint_every = checkpoint_every;
  o.warmup = 5;
  o.log_every = 10;
  o.eval_batches = 2;
  o.out = temp_folder("train_" + out);
  std::filesystem::remove_all(o.out);  // a fresh folder: train refuses to replace a run without force
  return o;
}

// The two run folders' weights are bit-identical (a Catch2 check per tensor).
inline void check_same_weights(const std::string& x, const std::string& y) {
  const auto a = nn::load_safetensors(x + "/model.safetensors").tensors;
  const auto b = nn::load_safetensors(y + "/model.safetensors").tensors;
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].first);
    CHECK(a[i].second.value<float>() == b[i].second.value<float>());
  }
}

}  // namespace qkv::test
