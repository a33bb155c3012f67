#pragma once
// `qkv ablate DIR`: what each attention head does for the task, measured by taking it away. On
// held-out sequences: the accuracy and loss with one head's output (its hook_z) zeroed, or
// replaced by its mean over the sequences at each position; and, for a task with a corrupted
// input (TaskSpec::corruption), with the head's output taken from the corrupted input while the
// rest of the model runs on the clean one (activation patching).
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "examples/cli/tasks/task.hpp"
#include "qkv/nn/transformer.hpp"

namespace qkv::cli {

struct AblationScore {
  double accuracy = 0;  // share of scored positions right
  double loss = 0;      // mean cross-entropy over them
};

struct HeadAblation {
  std::size_t layer = 0, head = 0;
  AblationScore zero, mean;
  // With the head's output from the corrupted input; none without a corruption.
  std::optional<AblationScore> patched;
  // The share of the loss the corrupted input adds that this head alone carries into the clean
  // run: (patched − clean) / (corrupted − clean); none without a corruption, or when the
  // corrupted input does not raise the loss.
  std::optional<double> patch_share;
  // Whether the task needs the head: zero- and mean-ablated, its accuracy falls below half the
  // clean accuracy.
  bool needed = false;
};

struct Ablation {
  std::string task, dir;
  std::size_t sequences = 0;
  std::uint64_t seed = 0;
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

// {task, dir, sequences, seed, clean: {accuracy, loss}, corruption, corrupted, heads: [{layer,
// head, name, zero, mean, patched, patch_share, needed}], needed: ["L0H1", …]}.
nlohmann::json to_json(const Ablation& ablation);

// A table, a head a row, and the heads the task needs.
void print_ablation(std::ostream& out, const Ablation& ablation);

}  // namespace qkv::cli
