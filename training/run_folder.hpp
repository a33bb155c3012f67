#pragma once
// A run folder: where a training run writes its config.json, metrics.jsonl, snapshots.jsonl and
// checkpoints (checkpoint.hpp), locked while it does; and the model a run folder holds.
#include <memory>
#include <optional>
#include <string>

#include "qkv/nn/checkpoint.hpp"
#include "qkv/nn/seq2seq.hpp"
#include "qkv/nn/transformer.hpp"
#include "qkv/tasks/train_options.hpp"

namespace qkv::training {

using tasks::TrainOptions;

// Where a run writes, locked: DIR itself, or, for a run that replaces another (options.force),
// DIR.new.tmp until its first checkpoint, which then takes DIR's place. Nothing is written before
// the folder is known to be free for the run: a folder with files of its own is left as it is.
// A folder that holds a run already is refused (UsageError) unless options.resume (then it is
// locked as it is, after what a write that died left is removed and its links are checked) or
// options.force; a folder holding files of no run is refused.
class RunFolder {
 public:
  RunFolder(std::string dir, const TrainOptions& options);
  ~RunFolder();  // a replacement that never checkpointed is removed
  RunFolder(const RunFolder&) = delete;
  RunFolder& operator=(const RunFolder&) = delete;

  // Where the run writes now: DIR, or DIR.new.tmp while it replaces another.
  const std::string& path() const { return staging_.empty() ? dir_ : staging_; }
  // Whether the run replaces another (--force) that is still in place: no checkpoint yet.
  bool replacing() const { return !staging_.empty(); }
  // After each checkpoint: a replacement run takes the old run's place at its first.
  void checkpointed();

 private:
  std::string dir_, target_, staging_;
  std::optional<nn::RunLock> lock_, staging_lock_;
};

// The model of a run folder, once config.json passes the program's checks (its task, ranges and
// memory): nn::load_transformer, or for a seq2seq task's run nn::load_encoder_decoder. Throws
// std::runtime_error naming the file at fault (load_model: a seq2seq run's folder, naming its task).
std::unique_ptr<nn::Transformer> load_model(const std::string& dir);
std::unique_ptr<nn::EncoderDecoder> load_encoder_decoder(const std::string& dir);

}  // namespace qkv::training
