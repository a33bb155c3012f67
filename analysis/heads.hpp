#pragma once
// Head detectors, as TransformerLens's head_detector defines them: the share of a head's attention
// that falls where a kind of head puts it, on given sequences.
//
//   previous_token   query i on key i − 1
//   duplicate_token  query i on each earlier key j < i that holds the same token
//   induction        query i on each key j ≤ i whose previous token (at j − 1) is the query's token:
//                    the token that followed the query's token last time
//
// A head's score on one sequence is Σ w ⊙ p / Σ w over its (T, T) weights w and the kind's 0/1
// pattern p (TransformerLens's "mul" measure: every query row sums to 1, so it is the mean over
// queries of the weight on the pattern's keys); over several sequences, the mean of theirs.
#include <cstdint>
#include <string>
#include <vector>

#include "qkv/core/tensor.hpp"
#include "qkv/nn/transformer.hpp"
#include "qkv/tasks/task.hpp"

namespace qkv::analysis {

enum class HeadKind { previous_token, duplicate_token, induction };

// The kinds, in the order above, and their names ("previous_token", ...).
inline constexpr HeadKind all_head_kinds[] = {HeadKind::previous_token, HeadKind::duplicate_token, HeadKind::induction};
const char* name_of(HeadKind kind);
inline std::string head_kind_name(HeadKind kind) { return name_of(kind); }

// The kind's (T, T) 0/1 pattern on a sequence of T tokens.
Array<double> detection_pattern(HeadKind kind, const std::vector<std::int64_t>& tokens);

// Σ weights ⊙ pattern / Σ weights, both (T, T); NaN weights (masked keys, as inspect draws them)
// count as 0. std::invalid_argument naming both shapes when they differ or are not square, and when
// the weights hold no mass.
double detection_score(const Array<double>& weights, const Array<double>& pattern);

// One head's scores: the mean of each kind's score over the sequences.
struct HeadDetection {
  std::size_t layer = 0, head = 0;
  double previous_token = 0, duplicate_token = 0, induction = 0;
  double score(HeadKind kind) const;
};

// Every head of `model`, layer by layer, on `sequences` (each run alone, so that no padding
// enters; each of 2 to max_len tokens of the vocabulary, else std::invalid_argument naming the
// sequence).
std::vector<HeadDetection> detect_heads(const nn::Transformer& model, const std::vector<std::vector<std::int64_t>>& sequences);
// The head of `found` that scores highest as `kind` (the first, on a tie); std::invalid_argument
// for none.
const HeadDetection& best_head(const std::vector<HeadDetection>& found, HeadKind kind);

// What inspect's head detectors (and the sweep measurement `heads`) read of a task: its first
// `count` held-out sequences (tasks::held_out_sequences, seed 0) that the model can read, of 2 to
// max_len tokens; none when the task draws no sequences (a run's own task, known by its
// vocabulary).
std::vector<std::vector<std::int64_t>> detection_sequences(const nn::Transformer& model, const tasks::Task& task,
                                                           std::size_t count = 64);

}  // namespace qkv::analysis
