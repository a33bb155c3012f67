#pragma once
// `qkv inspect DIR --across-training`: the analyses of a model measured at each checkpoint a run
// kept along training (training/kept_checkpoints.hpp), to draw against the step: held-out loss and
// accuracy, the in-context-learning score, and per head its σ, head-detector scores,
// prefix-matching score, patching share and direct logit attribution, with the composition
// between heads.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "qkv/analysis/heads.hpp"
#include "qkv/analysis/inspect.hpp"
#include "qkv/analysis/patching.hpp"
#include "qkv/tasks/registry.hpp"

namespace qkv::analysis {

struct HeadMeasures {
  double sigma = 0;  // the QK circuit's symmetric share (nn::symmetric_share)
  HeadDetection detection;
  // On random tokens repeated twice, the mean attention a query of the second copy pays to the
  // token after its earlier copy (the induction-heads paper's prefix matching).
  double prefix_matching = 0;
  // Patching (a task with a corrupted input): the share of the corrupted input's extra loss this
  // head's output (z, all positions) brings into the clean run (noising).
  std::optional<double> noising_share;
  // Its direct part of the logit difference (the token readout; logit_attribution.hpp).
  std::optional<double> logit_attribution;
};

// The mean next-token loss over the first quarter of each sequence's positions and over the last.
struct InContext {
  double early = 0, late = 0;
  // The in-context-learning score of Olsson et al. (2022), late − early: below 0 when later tokens
  // are predicted better for the context before them.
  double score() const { return late - early; }
};

struct CheckpointMeasures {
  std::size_t step = 0;
  double loss = 0, accuracy = 0;  // on the held-out batch
  // On the held-out batch, for a causal model that predicts tokens (token readout, as many classes
  // as tokens).
  std::optional<InContext> in_context;
  std::vector<std::vector<HeadMeasures>> heads;  // [layer][head]
  std::vector<HeadComposition> composition;
};

struct AcrossTraining {
  std::string task, dir;
  std::size_t sequences = 0;
  std::uint64_t seed = 0;
  std::vector<CheckpointMeasures> checkpoints;  // by step
};

struct MeasureOptions {
  std::size_t sequences = 64;  // held-out, one batch (patching's and attribution's too)
  std::uint64_t seed = 1;
  bool mask_padding = true;
};

// The prefix-matching score of each head [layer][head], on `sequences` sequences of
// max_len / 2 random tokens drawn from `seed`, each repeated twice.
std::vector<std::vector<double>> prefix_matching(const nn::Transformer& model, std::size_t sequences = 32,
                                                 std::uint64_t seed = 1);

// The next-token losses early and late in the sequences of `batch` (above), from `out`, the model's
// forward on them, leaving out a next token that is `pad`; none for a model they do not fit or a
// batch shorter than 8 tokens.
std::optional<InContext> in_context(const nn::Transformer& model, const nn::TransformerOutput& out, const tasks::Batch& batch,
                                    std::optional<std::int64_t> pad = std::nullopt);

// The step of `values` (by step, in order) from which on every value is past half of the way from
// the first value to the last: when a measure changed, read from the kept checkpoints (the change
// happened between the step before and this one). None for fewer than 2 values or no change.
std::optional<std::size_t> half_way_step(const std::vector<std::pair<std::size_t, double>>& values);

// When each part of the circuit formed: the half-way step of the held-out loss, of the in-context
// score, of each head's score of its role (the detector that scores it highest at the last
// checkpoint), and of each pair's K-composition.
struct Formation {
  std::optional<std::size_t> loss, in_context;
  struct Head {
    std::size_t layer = 0, head = 0;
    HeadKind role = HeadKind::previous_token;
    double score = 0;  // at the last checkpoint
    std::optional<std::size_t> step;
  };
  std::vector<Head> heads;
  struct Pair {
    std::size_t from_layer = 0, from_head = 0, to_layer = 0, to_head = 0;
    std::optional<std::size_t> step;  // of the K-composition
  };
  std::vector<Pair> composition;
  // The induction circuit: the best previous-token head and the best induction head at the last
  // checkpoint (best_head), the half-way steps of each one's score of that kind and of the
  // K-composition between them (none unless the first is in an earlier layer), whether the three
  // fall within one kept step of each other (no kept step strictly between the earliest and the
  // latest), and whether at or before the loss's.
  struct Circuit {
    HeadDetection previous_token, induction;
    std::optional<std::size_t> previous_token_step, induction_step, k_composition_step;
    std::optional<bool> together, before_loss;
  };
  Circuit circuit;
};
Formation formation(const AcrossTraining& across);

// Everything above for `model` as it is after `step` steps; std::invalid_argument for a count of
// sequences of 0 or past max_patch_sequences.
CheckpointMeasures measure_checkpoint(nn::Transformer& model, const tasks::Task& task,
                                      const std::optional<tasks::Corruption>& corruption, std::size_t step,
                                      const MeasureOptions& options = {});

}  // namespace qkv::analysis
