#pragma once
// A toy task: a seeded batch generator plus an accuracy measure. The tasks qkv knows are in its
// registry (registry.hpp); a program may define and train its own without registering it.
//
// Every task turns a sequence into tokens (B, T) and a target per position (B, T), with -100
// where nothing is scored (padding, openers, the first copy, ...). What a target means depends
// on the readout: for `pointer` tasks it is the index of the key position the model must attend
// to (brackets: a closer's opener); for `token` tasks it is a class the task head must predict.
//
// A seq2seq task (Seq2SeqTask: reverse, sort, translate) trains an encoder-decoder: its batches
// also hold the source (B, S) the encoder reads, and their tokens are the decoder's input, the
// output shifted right after a start token (teacher forcing), whose targets are the output and
// then the end token.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "qkv/core/random.hpp"
#include "qkv/nn/transformer.hpp"

namespace qkv::tasks {

constexpr std::int64_t ignore_target = -100;

struct Batch {
  IndexArray tokens;   // (B, T), padded with the task's pad token
  IndexArray targets;  // (B, T), ignore_target where nothing is scored
  IndexArray source{};  // a seq2seq task's (B, S), padded with its source_pad; 0-d for other tasks
};

using nn::Readout;

// The sides of a seq2seq task: the encoder reads the source; the decoder reads `start`, then the
// output token by token, and writes `end` after the output's last token.
struct Seq2SeqInfo {
  std::size_t source_vocab = 0;    // source ids 0 … source_vocab − 1
  std::size_t max_source_len = 0;  // the longest source, in tokens
  std::int64_t source_pad = 0;     // the source token of a batch's shorter rows
  std::int64_t start = 0, end = 0;  // target ids; the decoder's input past the end holds `end`
};

struct TaskInfo {
  std::string name;
  std::string description;
  std::size_t vocab_size = 0;  // token ids are 0 … vocab_size − 1
  std::size_t n_classes = 0;   // of token targets (0 for pointer tasks)
  std::size_t max_len = 0;     // longest sequence, in tokens
  Readout readout = nn::Readout::token;
  bool causal = true;
  std::optional<std::int64_t> pad{};  // the padding token of a batch's shorter rows, if any
  // A seq2seq task's source side; then vocab_size (= n_classes) is the output's vocabulary and
  // max_len the decoder's positions (the longest output and the end token).
  std::optional<Seq2SeqInfo> seq2seq{};
  // Whether sample() draws sequences: not for a run's own task known only by its vocabulary.
  bool draws = true;
};

struct Metrics {
  double accuracy = 0;     // share of scored positions predicted right
  double exact_match = 0;  // share of sequences with every scored position right
  std::size_t scored = 0;     // positions scored
  std::size_t sequences = 0;  // sequences with a scored position (exact_match's denominator)
};

// A (rows, cols) array of one value.
IndexArray filled(std::size_t rows, std::size_t cols, std::int64_t value);
// One sequence of tokens as a batch of one, (1, T).
IndexArray one_row(const std::vector<std::int64_t>& tokens);

// Tokens that are numbers 0 … n − 1, as text "3 17 5", and back; `task` names the task in the
// error for a word that is not such a number.
std::string numbers_text(const std::vector<std::int64_t>& tokens);
std::vector<std::int64_t> parse_numbers(const std::string& text, std::size_t n, const std::string& task);

// Predictions (B, T) against a batch's targets.
Metrics score(const IndexArray& predictions, const Batch& batch);
// The metrics of several batches together.
class MetricsSum {
 public:
  void add(const Metrics& batch);
  Metrics result() const;

 private:
  double correct_ = 0, exact_ = 0;  // right positions, and sequences right throughout
  std::size_t scored_ = 0, sequences_ = 0;
};

// A data-set task's examples: the rows it trains on and the rows held out, one batch each.
struct Split {
  Batch train, test;
};

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
  // For a pointer task, the key position each position of `tokens` points at (ignore_target where
  // none), as a batch's targets are; none when the input is not one the task would generate.
  virtual std::optional<std::vector<std::int64_t>> pointer_targets(const std::vector<std::int64_t>& tokens) const {
    (void)tokens;
    return std::nullopt;
  }
  // Sequences a model did not train on, from a generator no training batch draws from: sample()'s
  // for a task that draws its sequences, rows of the held-out split for a data-set task.
  virtual Batch sample_held_out(std::size_t batch_size, Generator& gen) const { return sample(batch_size, gen); }
  // A data-set task's examples, split; nullptr for a task that draws its sequences.
  virtual const Split* split() const { return nullptr; }
};

// A task that is a fixed set of examples rather than a generator: training reads its training split
// (whole, as one full batch, or `batch` rows at a time), and evaluation its held-out split, whole.
class DatasetTask : public Task {
 public:
  const TaskInfo& info() const override { return info_; }
  // batch_size rows of the training split, distinct, drawn at random (std::invalid_argument for more
  // rows than it has); the whole split, in order, when batch_size is its size.
  Batch sample(std::size_t batch_size, Generator& gen) const override;
  // The same from the held-out split.
  Batch sample_held_out(std::size_t batch_size, Generator& gen) const override;
  const Split* split() const override { return &split_; }

 protected:
  TaskInfo info_;
  Split split_;
};

// `rows` of a batch, in that order.
Batch select_rows(const Batch& batch, const std::vector<std::size_t>& rows);

// `text` as the tokens of `task` (Task::encode), at most `positions` of them: std::invalid_argument
// naming the fault for a word that is no token, no tokens at all, or more than fit.
std::vector<std::int64_t> encode_input(const Task& task, const std::string& text, std::size_t positions);

// A source, its output, and for each output token the source positions it comes from (reverse:
// the mirrored one; sort: the one holding the value; translate: the word it translates).
struct Seq2SeqExample {
  std::vector<std::int64_t> source, output;
  std::vector<std::vector<std::size_t>> alignment;
};

// A task that maps a source to an output, for an encoder-decoder. Its text is the source's
// (encode) and the output's (decode); token_name names output tokens, source_token_name source ones.
class Seq2SeqTask : public Task {
 public:
  const TaskInfo& info() const final { return info_; }
  // batch_size examples drawn at random.
  Batch sample(std::size_t batch_size, Generator& gen) const override;
  // The batch of these examples: sources padded with source_pad, the decoder's input (start, the
  // output, then `end`) and its targets (the output, `end`, then ignore_target).
  Batch batch(const std::vector<Seq2SeqExample>& examples) const;
  virtual Seq2SeqExample draw(Generator& gen) const = 0;
  // The example of a source; none when the task would never draw it (a word out of the grammar).
  virtual std::optional<Seq2SeqExample> example(const std::vector<std::int64_t>& source) const = 0;
  virtual std::string source_token_name(std::int64_t token) const = 0;
  const Seq2SeqInfo& sides() const { return *info_.seq2seq; }

 protected:
  TaskInfo info_;  // with its seq2seq sides, set by the task's constructor
};

// The task as a Seq2SeqTask; nullptr for a task of one sequence.
const Seq2SeqTask* as_seq2seq(const Task& task);

// The name of each token id of the task, as a run's config.json records them.
std::vector<std::string> token_names(const Task& task);
// The tokens' names (Task::token_name), space-separated: "3 17 =".
std::string names_text(const Task& task, const std::vector<std::int64_t>& tokens);

}  // namespace qkv::tasks
