#pragma once
// What the heads look like along training. `qkv train --snapshot-every N` writes one JSON object a
// line to OUT/snapshots.jsonl at step 0, at the log-spaced steps 10, 20, 30, 50, 100, … below N,
// at every multiple of N and at the last step (the line's fields: analysis/history.hpp, which
// reads them back); `qkv inspect DIR --html` draws them.
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/nn/transformer.hpp"
#include "qkv/tasks/task.hpp"
#include "qkv/tasks/train_options.hpp"

namespace qkv::report {

using tasks::Task;
using tasks::TrainOptions;

// Whether `step` is 10, 20, 30, 50, 100, … : 1, 2, 3 or 5 times a power of ten, from 10 on.
bool log_spaced(std::size_t step);

// The snapshots of a run with these options.
class Snapshots {
 public:
  Snapshots(const TrainOptions& options, const Task& task);
  // Whether a snapshot is taken after `step` steps.
  bool due(std::size_t step) const;
  // The snapshot of `model` after `step` steps: one line of snapshots.jsonl.
  nlohmann::json take(std::size_t step, const nn::Transformer& model) const;

 private:
  const TrainOptions& options_;
  const Task& task_;
  std::vector<std::int64_t> input_;
};

}  // namespace qkv::report
