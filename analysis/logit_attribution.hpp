#pragma once
// Direct logit attribution: how much each part of the residual stream adds to the logit
// difference (the target's logit minus the best other one) through the readout alone. The final
// stream is the sum of the token and position embeddings, each head's output (its z through its
// slice of W_O), each attention's output bias and each MLP's output; ln_final is linear in it once
// its scale is held at the run's (TransformerLens's apply_ln_to_stack), so with
//   d = ln_final.weight ⊙ (W_U[target] − W_U[other])
// a part x adds (x − mean(x)) / scale · d, and the parts and the constant (ln_final's bias and the
// head's bias along the same direction) add up to the logit difference exactly.
#include <cstdint>
#include <string>
#include <vector>

#include "qkv/nn/transformer.hpp"
#include "qkv/tasks/task.hpp"

namespace qkv::analysis {

struct LogitAttributionOptions {
  std::size_t sequences = 256;  // held-out, one batch, at most max_patch_sequences
  std::uint64_t seed = 1;
  bool mask_padding = true;
};

// Means over the scored positions (those where another class has a finite logit).
struct LogitAttribution {
  std::string task;
  std::size_t sequences = 0, positions = 0;  // positions: the scored ones averaged
  std::uint64_t seed = 0;
  double logit_diff = 0;             // of the model's own logits
  double embed = 0, pos_embed = 0;   // the token and position embeddings
  double bias = 0;                   // ln_final's and the head's biases along the direction
  std::vector<std::vector<double>> heads;  // [layer][head]
  std::vector<double> attn_bias;     // per layer: its out_proj bias
  std::vector<double> mlp;           // per layer: its MLP's output (empty without MLPs)
  // A layer's attention: its heads and its bias.
  double attention(std::size_t layer) const;
  // Every part: equals logit_diff up to rounding.
  double total() const;
};

// On the task's held-out sequences of `options.seed`; std::invalid_argument for the pointer
// readout, whose logits are attention scores and have no readout to attribute through.
LogitAttribution logit_attribution(nn::Transformer& model, const tasks::Task& task,
                                   const LogitAttributionOptions& options = {});

}  // namespace qkv::analysis
