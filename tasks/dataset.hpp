#pragma once
// Sequences with their targets, from a file rather than a task's generator: what `qkv eval --data`
// and `qkv ablate --data` score a run on, whatever wrote it (a library program's run has no task
// to draw sequences from).
//
// The file is JSON lines, one sequence a line:
//   {"tokens": [3, 17, 5], "targets": [-100, 2, 0], "corrupted": [3, 9, 5]}
// "tokens": token ids, or a string read as the task's text (its token names for a library
// program's run). "targets": one per token, as a batch's (the class of a token readout, the key
// position of a pointer readout), -100 or null where nothing is scored. "corrupted" (optional, on
// every line or none): the same sequence corrupted, for activation patching; it is scored on the
// clean targets. Blank lines are skipped.
#include <cstdint>
#include <string>
#include <vector>

#include "qkv/tasks/task.hpp"

namespace qkv::tasks {

struct Dataset {
  std::string file;  // where it was read from ("" for sequences drawn from a task)
  // The sequences as batches of one length each (rows of equal length share a batch, up to
  // batch_rows a batch, in the order of the file).
  std::vector<Batch> batches;
  // One (B, T) array a batch, the corrupted tokens of its rows; empty when there are none.
  std::vector<IndexArray> corrupted;
  std::string corruption;  // what the corruption is ("" without one)
  std::size_t sequences() const;
  std::size_t scored() const;  // targets that are not ignore_target
};

constexpr std::size_t batch_rows = 256;

// The file's sequences for `task` (whose vocabulary, readout and classes bound the ids), each at
// most `positions` tokens. Throws std::invalid_argument naming the file, the line and the field at
// fault: an id outside the vocabulary, a target outside the classes (or, for a pointer readout,
// the sequence), lengths that differ, "corrupted" on some lines only, no scored target at all.
Dataset read_dataset(const std::string& path, const Task& task, std::size_t positions);

// Batches (decoder-only: no source) written as read_dataset reads them, atomically; `corrupted`
// empty or one (B, T) array a batch.
void write_dataset(const std::string& path, const std::vector<Batch>& batches, const std::vector<IndexArray>& corrupted = {});

}  // namespace qkv::tasks
