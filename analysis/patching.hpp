#pragma once
// `qkv patch DIR --component C`: activation patching by component and position, as
// TransformerLens's patching.py does it. A task's clean sequences and their corrupted twins
// (TaskSpec::corruption) are run once each with a cache; then, for each layer (and head) and each
// position (or all at once), one run with that activation taken from the other run:
//
//   denoising (TransformerLens's default): the corrupted run with the clean activation; its share
//             of a metric is (patched − corrupted) / (clean − corrupted), how much of the clean
//             result this activation alone restores
//   noising:  the clean run with the corrupted activation; its share is (patched − clean) /
//             (corrupted − clean), how much of the damage this activation alone brings
//
// Components, by their hook points (hooks.hpp) in block L:
//   resid_pre, attn_out, resid_mid, mlp_out, resid_post   blocks.L.hook_NAME           (B, T, d_model)
//   q, k, v, z                                            blocks.L.attn.hook_NAME      per head, (B, T, H, d)
//   pattern                                               blocks.L.attn.hook_pattern   per head, (B, H, T, T)
// By position, a residual or per-head component is patched at one position (every sequence's),
// the pattern at one (query, key) pair, as get_act_patch_attn_head_pattern_dest_src_pos does.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "qkv/core/tensor.hpp"
#include "qkv/nn/transformer.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/tasks/task.hpp"

namespace qkv::analysis {

enum class PatchComponent { resid_pre, attn_out, resid_mid, mlp_out, resid_post, q, k, v, pattern, z };

// The components in the order above, and their names ("resid_pre", …; nn::from_name and
// nn::names_of read them); patch_component throws std::invalid_argument naming the name and
// listing the known ones.
inline constexpr PatchComponent all_patch_components[] = {
    PatchComponent::resid_pre, PatchComponent::attn_out, PatchComponent::resid_mid, PatchComponent::mlp_out,
    PatchComponent::resid_post, PatchComponent::q, PatchComponent::k, PatchComponent::v,
    PatchComponent::pattern, PatchComponent::z};
const char* name_of(PatchComponent component);
inline std::string patch_component_name(PatchComponent component) { return name_of(component); }
PatchComponent patch_component(const std::string& name);
// Whether the component is one per head (q, k, v, pattern, z).
bool per_head(PatchComponent component);

inline constexpr std::size_t max_patch_sequences = 10'000;

struct PatchOptions {
  PatchComponent component = PatchComponent::z;
  bool by_position = false;  // each position (pattern: each (query, key) pair) apart; else all at once
  bool noising = false;      // the clean run with corrupted activations; else denoising
  // Held-out sequences, drawn as one batch (on induction, then, all of one length), at most
  // max_patch_sequences.
  std::size_t sequences = 256;
  std::uint64_t seed = 1;
  bool mask_padding = true;
};

// The task's held-out sequences of `seed`, drawn as one batch of `sequences`, with its padding mask
// (tasks::key_padding): what patching, attribution and the measures along training read.
// std::invalid_argument naming `op` for a count of 0 or past max_patch_sequences.
struct HeldOutBatch {
  tasks::Batch batch;
  MaskArray mask;
};
HeldOutBatch held_out_batch(const nn::Transformer& model, const tasks::Task& task, std::size_t sequences, std::uint64_t seed,
                            bool mask_padding, const char* op);

// The batches patching compares: the task's held-out sequences of `seed` (one batch of
// `sequences`) and their corruption, scored on the clean targets, each with its padding mask
// (tasks::key_padding). std::invalid_argument for a count of 0 or past max_patch_sequences.
struct PatchPair {
  tasks::Batch clean, corrupt;
  MaskArray clean_mask, corrupt_mask;
};
PatchPair patch_pair(const nn::Transformer& model, const tasks::Task& task, const tasks::Corruption& corruption,
                     std::size_t sequences, std::uint64_t seed, bool mask_padding = true);

// A run's three metrics on the scored positions: accuracy, mean loss, and the mean logit
// difference (the target's logit minus the best other one).
struct PatchScore {
  double accuracy = 0, loss = 0, logit_diff = 0;
};

struct Patching {
  std::string task, dir, corruption, component, direction;  // direction: "denoising" or "noising"
  std::size_t sequences = 0, length = 0;  // the batch: sequences × length tokens (with padding)
  std::uint64_t seed = 0;
  bool by_position = false;
  bool attribution = false;  // attribution_patch's first-order estimates, not patched runs
  PatchScore clean, corrupted;
  // Per layer, head (1 for a residual component) and position (1 for all at once; pattern by
  // position: query × key): patched[l][h][p] (pattern: p = query · length + key).
  std::vector<std::vector<std::vector<PatchScore>>> patched;
  std::vector<std::string> positions;  // by position: the first sequence's tokens, by name
  // The share of each metric: see above; NaN where clean and corrupted give the same value.
  static double share(double patched, double clean, double corrupted, bool noising);
  double loss_share(std::size_t layer, std::size_t head, std::size_t position) const;
};

// The activations at the hook points `points` of a forward on `tokens`, and the gradient there of
// `scalar` (a number of the forward's output, such as its loss): what TransformerLens's
// run_with_cache(incl_bwd=True) keeps. The parameters' gradients are left as they were. Its
// backward clears the thread's tape, as any backward does: call it with no other forward waiting
// for its backward. Needs gradients enabled (std::logic_error under a NoGradGuard); an unknown
// point is std::invalid_argument.
struct ActivationGradients {
  nn::TransformerOutput output;
  nn::Activations activations, gradients;
};
// The metrics of a forward's output on `batch`'s targets.
PatchScore score_patch(const nn::Transformer& model, const nn::TransformerOutput& out, const tasks::Batch& batch);

ActivationGradients run_with_gradients(nn::Transformer& model, const IndexArray& tokens, const std::vector<std::string>& points,
                                       const std::function<Tensor(const nn::TransformerOutput&)>& scalar,
                                       const MaskArray& key_padding = MaskArray());

// Attribution patching: every patch of `options` at once, to first order. A patch's change of the
// loss is estimated as Σ (source activation − run activation) · ∂loss/∂activation over what it
// replaces, the gradient taken in the run it patches (the corrupted run when denoising); its
// accuracy and logit difference are not estimated (NaN). Returns what patch would, with
// `attribution` set and each patched loss the estimate.
Patching attribution_patch(nn::Transformer& model, const tasks::Task& task, const tasks::Corruption& corruption,
                           const PatchOptions& options);

// Patches `options.component` of `model` on the task's held-out sequences of `options.seed` and
// their corruption. The model's own hooks stay as they were. std::invalid_argument for a
// component the model lacks (resid_mid and mlp_out need the MLP).
Patching patch(nn::Transformer& model, const tasks::Task& task, const tasks::Corruption& corruption,
               const PatchOptions& options);

}  // namespace qkv::analysis
