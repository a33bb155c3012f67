#pragma once
// A toy task: a seeded batch generator plus an accuracy measure.
//
// Every task turns a sequence into tokens (B, T) and a target per position (B, T), with -100
// where nothing is scored (padding, openers, the first copy, ...). What a target means depends
// on the readout: for `pointer` tasks it is the index of the key position the model must attend
// to (brackets: a closer's opener); for `token` tasks it is a class the task head must predict.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qkv/core/random.hpp"
#include "qkv/nn/transformer.hpp"

namespace qkv::cli {

constexpr std::int64_t ignore_target = -100;

struct Batch {
  IndexArray tokens;   // (B, T), padded with the task's pad token
  IndexArray targets;  // (B, T), ignore_target where nothing is scored
};

using nn::Readout;

struct TaskInfo {
  std::string name;
  std::string description;
  std::size_t vocab_size = 0;  // token ids are 0 … vocab_size − 1
  std::size_t n_classes = 0;   // of token targets (0 for pointer tasks)
  std::size_t max_len = 0;     // longest sequence, in tokens
  Readout readout = nn::Readout::token;
  bool causal = true;
};

struct Metrics {
  double accuracy = 0;     // share of scored positions predicted right
  double exact_match = 0;  // share of sequences with every scored position right
  std::size_t scored = 0;     // positions scored
  std::size_t sequences = 0;  // sequences with a scored position (exact_match's denominator)
};

// A (rows, cols) array of one value.
IndexArray filled(std::size_t rows, std::size_t cols, std::int64_t value);

// Predictions (B, T) against a batch's targets.
Metrics score(const IndexArray& predictions, const Batch& batch);

class Task {
 public:
  virtual ~Task() = default;
  virtual const TaskInfo& info() const = 0;
  virtual Batch sample(std::size_t batch_size, Generator& gen) const = 0;
  // Text for a row of tokens (padding dropped), and back; encode throws std::invalid_argument
  // naming the character it cannot read.
  virtual std::string decode(const std::vector<std::int64_t>& tokens) const = 0;
  virtual std::vector<std::int64_t> encode(const std::string& text) const = 0;
  // A short label for one token id, for tables and plots ("BOS", "(", "Ra", "17").
  virtual std::string token_name(std::int64_t token) const = 0;
};

std::vector<std::string> task_names();
// Throws std::invalid_argument naming the task and listing the known ones.
std::unique_ptr<Task> make_task(const std::string& name);

}  // namespace qkv::cli
