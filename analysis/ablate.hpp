#pragma once
// `qkv ablate DIR`: what each attention head does for the task, measured by taking it away. On
// held-out sequences: the accuracy and loss with one head's output (its hook_z) zeroed, or
// replaced by its mean over the sequences at each position; and, for a task with a corrupted
// input (TaskSpec::corruption), activation patching both ways: the head's output from the
// corrupted input in the clean run (noising), and from the clean input in the corrupted run
// (denoising).
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "qkv/tasks/dataset.hpp"
#include "qkv/tasks/task.hpp"
#include "qkv/nn/transformer.hpp"
#include "qkv/tasks/registry.hpp"

namespace qkv::analysis {

using tasks::Corruption;
using tasks::Task;

struct AblationScore {
  double accuracy = 0;  // share of scored positions right
  double loss = 0;      // mean cross-entropy over them
};

struct HeadAblation {
  std::size_t layer = 0, head = 0;
  // Whether the model reads the head's output: not for the last layer of a pointer model, whose
  // readout is that layer's head-0 scores (made before any head's output). Such a head has no
  // numbers below.
  bool read = true;
  AblationScore zero, mean;
  // Activation patching (none without a corruption). Noising: the clean run with this head's
  // output from the corrupted input; its share is the part of the corrupted input's extra loss it
  // brings, (noised − clean) / (corrupted − clean): how much the task needs what this head reads.
  // Denoising: the corrupted run with this head's output from the clean input; its share is the
  // part of that extra loss it takes back, (corrupted − denoised) / (corrupted − clean): how much
  // this head alone restores (TransformerLens's default direction). Shares are none when the
  // corrupted input does not raise the loss.
  std::optional<AblationScore> noised, denoised;
  std::optional<double> noising_share, denoising_share;
  // Whether the task needs the head: zero- and mean-ablated, its accuracy falls below half the
  // clean accuracy.
  bool needed = false;
};

struct Ablation {
  std::string task, dir;
  std::size_t sequences = 0;
  std::uint64_t seed = 0;  // of the held-out sequences, when they were drawn
  std::string data;        // the file they were read from, when they were read (read_dataset)
  AblationScore clean;
  std::string corruption;  // its description; "" for a task without one
  std::optional<AblationScore> corrupted;  // the corrupted input, scored on the clean targets
  std::vector<HeadAblation> heads;         // layer by layer, head by head
};

// Each head's mean output (its hook_z) at each position, over the positions of the sequences that
// are not padding: per layer, (max_len, heads, d_v), 0 at a position no sequence reaches. The
// sequences are `batches` batches of `batch_size` drawn as `evaluate` draws them from `seed`.
std::vector<Array<double>> mean_head_outputs(nn::Transformer& model, const Task& task, std::size_t batches,
                                             std::size_t batch_size, std::uint64_t seed, bool mask_padding = true);

// Every head of `model` ablated in turn, on `batches` batches of `batch_size` held-out sequences
// drawn as `evaluate` draws them (the same `seed` gives the same sequences, and the clean
// accuracy is evaluate's); mean ablation puts mean_head_outputs in place of the head's output.
// The model's own hooks stay as they were.
Ablation ablate(nn::Transformer& model, const Task& task, const std::optional<Corruption>& corruption, std::size_t batches,
                std::size_t batch_size, std::uint64_t seed, bool mask_padding = true);

// The same on the sequences of a data set (read_dataset), with patching when it has corrupted
// tokens.
Ablation ablate(nn::Transformer& model, const Task& task, const tasks::Dataset& data, bool mask_padding = true);

}  // namespace qkv::analysis
