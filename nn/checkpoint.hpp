#pragma once
// A run folder's checkpoints, so that no run is ever lost:
//
//   DIR/checkpoint-00001000/        one complete checkpoint: its files (model.safetensors, …)
//   DIR/checkpoint -> checkpoint-00001000            the committed one
//   DIR/model.safetensors -> checkpoint/model.safetensors   (and each other file likewise)
//   DIR/run.lock                    held by the process that writes the folder
//
// A checkpoint is written into checkpoint-STEP.tmp/, each file flushed to disk, the folder renamed
// to checkpoint-STEP/, then committed in one step: a new DIR/checkpoint link renamed over the old
// one. A process killed at any moment leaves the previous checkpoint committed and whole; what it
// left half-written ends in .tmp and remove_partial_files clears it. The checkpoint before the
// committed one is kept, so that a resume can fall back to it if the newest cannot be read.
#include <cstddef>
#include <functional>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "qkv/nn/module.hpp"
#include "qkv/nn/safetensors.hpp"

namespace qkv::nn {

// An exclusive lock on a run folder (flock on DIR/run.lock), released when this object goes. A
// second process that asks for it fails at once with std::runtime_error naming the folder and the
// holder's pid, rather than mixing its files with the first one's.
class RunLock {
 public:
  explicit RunLock(const std::string& dir);
  ~RunLock();
  RunLock(RunLock&& other) noexcept;
  RunLock& operator=(RunLock&&) = delete;
  RunLock(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

// File name → bytes.
using CheckpointFiles = std::vector<std::pair<std::string, std::string>>;

// Writes `files` as DIR/checkpoint-STEP and commits it (see above), then removes every other
// checkpoint but the newest one before it. Throws std::runtime_error naming the file on an I/O
// error, with the previous checkpoint still committed.
void commit_checkpoint(const std::string& dir, std::size_t step, const CheckpointFiles& files);

// The folder that holds the committed checkpoint's files: DIR/checkpoint-STEP, or DIR itself for
// a run written before checkpoints had folders of their own (its files directly in DIR); none
// when the run has no checkpoint yet. A DIR/checkpoint that is not a link to a checkpoint-STEP
// folder of DIR (a link to elsewhere or to itself, a file) throws std::runtime_error naming it.
std::optional<std::string> committed_checkpoint(const std::string& dir);

// Throws std::runtime_error naming the entry when one of DIR/NAME, for each of `names`, is neither
// missing, a link nor a regular file (a folder of the user's, say), where a commit would link
// DIR/NAME to checkpoint/NAME. commit_checkpoint checks it before it writes anything.
void check_file_links(const std::string& dir, const std::vector<std::string>& names);

// Every DIR/checkpoint-STEP folder, newest first, as (step, path).
std::vector<std::pair<std::size_t, std::string>> checkpoint_folders(const std::string& dir);

// Commits an existing checkpoint folder again: a resume that fell back to it. The newer ones stay
// until the resumed run commits its next checkpoint.
void recommit_checkpoint(const std::string& dir, std::size_t step);

// Whether `name` is what a write of a run folder's that died leaves: checkpoint-STEP.tmp,
// checkpoint.tmp, or FILE.tmp for one of `files`. A user's own .tmp files are not.
bool is_partial_file(std::string_view name, const std::vector<std::string>& files);
// Removes every such entry from DIR.
void remove_partial_files(const std::string& dir, const std::vector<std::string>& files);

// The step of a checkpoint folder's path (".../checkpoint-00001000" -> 1000), if it is one.
std::optional<std::size_t> checkpoint_step(const std::string& folder);

// Swaps the folder `dir` with `replacement` in one step (renameat2 RENAME_EXCHANGE; two renames
// where the file system has no exchange, with the old folder put back if the second fails), then
// removes what was at `dir`. For `--force`: the old run stays until the new one's first checkpoint.
void replace_folder(const std::string& dir, const std::string& replacement);

// Training checkpoints, on top of the folders above. Each checkpoint-STEP folder holds
// model.safetensors (the model's state_dict) and optimizer.safetensors (an optimizer's
// state_dict, e.g. optim::Adam's); both carry the step in their metadata, the optimizer's file
// also the caller's metadata (a generator's state, say). The caller holds the folder's RunLock.
//
//   nn::RunLock lock(dir);
//   nn::save_checkpoint(dir, model, adam.state_dict(), {.step = 1000});
//   nn::Checkpoint c = nn::load_checkpoint(dir, model);   // the weights are in `model`
//   adam.load_state_dict(c.optimizer.tensors);
struct CheckpointInfo {
  std::size_t step = 0;
  std::map<std::string, std::string> metadata{};  // "step" is the checkpoint's own
};

// Writes and commits DIR/checkpoint-STEP (commit_checkpoint): std::runtime_error naming the file on
// an I/O error, std::logic_error when step STEP is committed already.
void save_checkpoint(const std::string& dir, const Module& model, const StateDict& optimizer_state,
                     const CheckpointInfo& info);

struct Checkpoint {
  std::string folder;  // where it was read from
  CheckpointInfo info;
  Safetensors model, optimizer;
};

// The checkpoint of the two files of one folder, parsed: both must carry the same step. Throws
// std::runtime_error naming the file and the fault.
Checkpoint parse_checkpoint(const std::string& folder, Safetensors model, Safetensors optimizer);
// Reads FOLDER/model.safetensors and FOLDER/optimizer.safetensors; a checkpoint-STEP folder must
// hold the files of step STEP.
Checkpoint read_checkpoint(const std::string& folder);
// Reads DIR's committed checkpoint and loads its weights into `model` (a file whose names or
// shapes do not fit the model throws std::runtime_error naming the file, with `model` unchanged).
// The optimizer's state is the caller's to load.
Checkpoint load_checkpoint(const std::string& dir, Module& model);
// Loads a checkpoint's weights into `model`, as load_checkpoint does; or weights already read from
// `file` (which names them in messages). Weights named as runs before the current scheme named
// them load too (older_weight_names).
void load_weights(const Checkpoint& checkpoint, Module& model);
void load_weights(const Safetensors& weights, const std::string& file, Module& model);
// The names of weights saved before a model's weights were named on the paths of its hook
// points, as they are named now: layers.L.* → blocks.L.* (layers.L.fc/proj → blocks.L.mlp.fc/proj),
// ln_f.* → ln_final.*, encoder.L.* / decoder.L.* → encoder.blocks.L.* / decoder.blocks.L.*
// (decoder.L.self_attn → decoder.blocks.L.attn). A name is renamed only where `model` has no
// weight of that name and has one of the new name, so a module of the user's own that names its
// weights layers.L.* loads as it was saved.
StateDict older_weight_names(StateDict weights, const Module& model);
// Loads the committed checkpoint's model.safetensors alone into `model`, for inference (or a run
// written before checkpoints had an optimizer's file).
void load_weights(const std::string& dir, Module& model);

// For a resume: calls `restore` on the committed checkpoint or, when it cannot be read or
// `restore` throws std::runtime_error, on the newest older one for which it succeeds, which
// becomes the committed one; each one passed over is reported on `notes`, and so is a
// DIR/checkpoint that pointed elsewhere (committed_checkpoint), which the one restored replaces.
// None when the run has no checkpoint; std::runtime_error, naming each checkpoint's fault, when
// none restores.
std::optional<Checkpoint> resume_checkpoint(const std::string& dir,
                                            const std::function<void(const Checkpoint&)>& restore,
                                            std::ostream& notes);

}  // namespace qkv::nn
