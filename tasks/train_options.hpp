#pragma once
// The options of a training run: the task, the model, the budget and the schedule. A task's
// registry entry (registry.hpp) sets its defaults; training/ checks them, records them in a run's
// config.json and trains by them.
#include <cstdint>
#include <string>

#include "qkv/nn/transformer.hpp"

namespace qkv::tasks {

struct TrainOptions {
  std::string task;
  std::size_t n = 0;  // the task's size (line, cycle: its values); 0 for a task that has none
  std::string out;  // run folder; "" means runs/TASK
  std::uint64_t seed = 0;
  // A data-set task (TaskSpec::make_dataset) trains on its training split: `batch` rows of it a
  // step, drawn afresh, or the whole split each step (full batch) with batch 0.
  std::size_t steps = 2000, batch = 32, warmup = 100, log_every = 100;
  // AdamW (weight decay decoupled, on every parameter) with betas (0.9, beta2); gradients clipped
  // to a norm of `clip` (0: not clipped).
  double lr = 3e-3, min_lr_ratio = 0.1, weight_decay = 0, beta2 = 0.999, clip = 1.0;
  // A data-set task's share of its examples that trains (the rest is held out), split by `seed`;
  // 0 for other tasks.
  double train_fraction = 0;
  std::size_t eval_batches = 32;  // of `batch` fresh sequences each (a data-set task: its held-out split)
  std::size_t checkpoint_every = 500;  // and at the end
  // With N > 0, OUT/snapshots.jsonl keeps what the heads look like along training (report/snapshots.hpp)
  // at step 0, the log-spaced steps 10, 20, 30, 50, 100, … below N, every N steps and the last.
  std::size_t snapshot_every = 0;
  // "log" or "every:N": OUT/checkpoints/ keeps the model's weights along training
  // (training/kept_checkpoints.hpp); "" keeps none.
  std::string keep_checkpoints;
  std::size_t threads = 1;             // recorded; the caller sets them (set_num_threads)
  // Bidirectional layers mask the padding keys (key_padding). Runs written before it was recorded
  // trained without, and are read back so.
  bool mask_padding = true;
  std::string blas;                    // the BLAS kernels the run started on (blas_kernels())
  std::size_t stop_after = 0;  // stop (checkpointed) after this step, to resume later; 0: run to the end
  bool resume = false;         // continue the run in `out` from its checkpoint
  // Replace a run already in `out`: the new run trains in OUT.new.tmp until its first checkpoint,
  // then takes OUT's place; until then the old run is untouched. Without it, train refuses such a
  // folder.
  bool force = false;
  // Every `target_every` steps (0: never), accuracy on `target_batches` held-out batches; the
  // first step where it reaches `target` is TrainResult::steps_to_target.
  double target = 0;
  std::size_t target_every = 0, target_batches = 4;
  // The decoder-only model; for a seq2seq task the encoder-decoder's decoder (layers, max_len: its
  // positions) and what both sides share (d_model, heads, qk, proj, mlp, positions), with:
  nn::TransformerConfig model;
  std::size_t encoder_layers = 0;  // the encoder's layers (0 for other tasks)
  std::size_t max_source_len = 0;  // the encoder's positions (0 for other tasks)
};

// The largest values train accepts. Memory is checked apart (check_memory), and refuses most runs
// long before these.
inline constexpr std::size_t max_steps = 1'000'000'000, max_batch = 1'000'000,
                             max_layers = nn::TransformerConfig::max_layers, max_width = nn::TransformerConfig::max_width,
                             max_threads = 1024;

}  // namespace qkv::tasks
