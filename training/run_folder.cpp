#include "qkv/training/run_folder.hpp"

#include <filesystem>

#include <fmt/format.h>

#include "qkv/nn/checkpoint.hpp"
#include "qkv/nn/files.hpp"
#include "qkv/nn/safetensors.hpp"
#include "qkv/training/memory.hpp"
#include "qkv/training/options.hpp"

namespace qkv::training {

using namespace tasks;

namespace fs = std::filesystem;

namespace {

// The files of a run folder besides its checkpoint folders; FILE.tmp is a write of one that died.
const std::vector<std::string> run_files = {"config.json", "metrics.jsonl", "snapshots.jsonl", "model.safetensors",
                                            "optimizer.safetensors"};

// A folder a run has written: its config or a checkpoint (or its link, even one that points
// elsewhere).
bool holds_run(const std::string& dir) {
  if (fs::exists(dir + "/config.json") || !nn::checkpoint_folders(dir).empty()) return true;
  try {
    return nn::committed_checkpoint(dir).has_value();
  } catch (const std::runtime_error&) {  // a link of the run's that points elsewhere; a file is the user's
    std::error_code error;
    return fs::is_symlink(fs::symlink_status(dir + "/checkpoint", error));
  }
}

// Refuses a folder with files that are not a run's: the lock, or what a write that died left.
void check_holds_nothing_else(const std::string& dir) {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name != "run.lock" && !nn::is_partial_file(name, run_files)) throw UsageError(fmt::format("--out {}: holds '{}' and no qkv run; choose a new or empty folder", dir, name));
  }
}

// Checks that the run folder's model is (`seq2seq`) or is not an encoder-decoder, and that it fits
// in memory.
void check_run(const std::string& dir, bool seq2seq) {
  const TrainOptions o = read_config(dir);
  if ((o.encoder_layers > 0) != seq2seq)
    throw std::runtime_error(fmt::format("{}: a {} run, whose model is {}", dir, o.task,
                                         seq2seq ? "decoder-only, not an encoder-decoder"
                                                 : "an encoder-decoder: this reads decoder-only models"));
  try {
    check_memory(o, false);
  } catch (const OptionError& e) {
    throw std::runtime_error(fmt::format("{}/config.json: '{}' {}", dir, config_field(o, e.field), e.what()));
  }
}

}  // namespace

RunFolder::RunFolder(std::string dir, const TrainOptions& o) : dir_(std::move(dir)) {
  std::error_code error;
  const bool exists = fs::exists(dir_, error);
  if (exists && !fs::is_directory(dir_, error)) throw UsageError(fmt::format("--out {}: is a file, not a folder", dir_));
  if (o.resume) {
    lock_.emplace(dir_);
    nn::remove_partial_files(dir_, run_files);
    nn::check_file_links(dir_, {"checkpoint", "model.safetensors", "optimizer.safetensors"});
    return;
  }
  const auto refuse = [&] {
    if (!o.force)
      throw UsageError(fmt::format("--out {}: holds a run already; give --resume to continue it or --force to "
                                   "replace it (the old run stays until the new one's first checkpoint)",
                                   dir_));
  };
  if (exists && holds_run(dir_)) refuse();
  if (exists && !holds_run(dir_)) check_holds_nothing_else(dir_);
  fs::create_directories(dir_);
  lock_.emplace(dir_);
  // Again under the lock: another process may have started a run here meanwhile.
  if (!holds_run(dir_)) {
    check_holds_nothing_else(dir_);
    nn::remove_partial_files(dir_, run_files);
    return;
  }
  refuse();
  fs::path target = fs::absolute(dir_).lexically_normal();
  if (!target.has_filename()) target = target.parent_path();
  if (target == target.root_path()) throw UsageError(fmt::format("--out {}: cannot be replaced", dir_));
  target_ = target.string();
  staging_ = target_ + ".new.tmp";
  if (fs::exists(staging_)) {
    staging_lock_.emplace(staging_);  // not while another process trains there
    staging_lock_.reset();
    fs::remove_all(staging_);  // what a replacement that died before its first checkpoint left
  }
  fs::create_directories(staging_);
  staging_lock_.emplace(staging_);
}
RunFolder::~RunFolder() {
  std::error_code ignored;
  if (!staging_.empty()) fs::remove_all(staging_, ignored);  // a replacement that never checkpointed
}

void RunFolder::checkpointed() {
  if (staging_.empty()) return;
  nn::replace_folder(target_, staging_);
  staging_.clear();
  dir_ = target_;  // absolute: a relative path may have named the old folder (--out .)
  lock_.reset();  // the old run's lock, removed with it
  lock_.emplace(std::move(*staging_lock_));
  staging_lock_.reset();
}

// The program's checks passed: the library's loaders do the rest.
std::unique_ptr<nn::Transformer> load_model(const std::string& dir) {
  check_run(dir, false);
  return nn::load_transformer(dir);
}

std::unique_ptr<nn::EncoderDecoder> load_encoder_decoder(const std::string& dir) {
  check_run(dir, true);
  return nn::load_encoder_decoder(dir);
}

}  // namespace qkv::training
