#pragma once
// `qkv inspect DIR` on a seq2seq run: where the decoder's cross-attention looks in the source.
// Per decoder layer and head, the alignment matrix (output position × source position) on one
// source, and the alignment score: the share of its weight a query puts on the source positions
// its output token comes from (the task's true alignment: reverse's mirrored position, sort's
// position of the value, translate's word), on that source and on held-out ones. Also the
// encoder's and the decoder's self-attention on the source. report/alignment.hpp renders it.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "qkv/analysis/inspect.hpp"  // TrainingHistory
#include "qkv/tasks/task.hpp"
#include "qkv/nn/seq2seq.hpp"

namespace qkv::analysis {

using tasks::Seq2SeqTask;

// The mean, over the output tokens (the first alignment.size() rows of `weights`, (T, S)), of the
// weight on their aligned source positions.
double alignment_score(const Array<double>& weights, const std::vector<std::vector<std::size_t>>& alignment);
// Whether output token t's most weighted source position (the first of equals) is one it is aligned with.
bool top_aligned(const Array<double>& weights, const std::vector<std::vector<std::size_t>>& alignment, std::size_t t);

struct CrossHead {
  std::size_t layer = 0, head = 0;
  // On the input, teacher forced: (output tokens + 1, source tokens); row t is the query that
  // writes output token t (the last row writes the end token).
  Array<double> weights;
  std::optional<double> on_input;  // the alignment score there; none when the task has no example of the input
  double held_out = 0;             // over held-out sources
  double top1 = 0;                 // held out: the share of output tokens whose most weighted position is aligned
  double sigma = 0;                // symmetric share of W_q W_kᵀ: 1 for tied or identity projections
};

struct AlignmentInspection {
  std::string task, dir;
  nn::EncoderDecoderConfig config;
  std::vector<std::int64_t> source;
  std::vector<std::string> source_names;
  // The output the decoder reads (the task's for an input it has an example of, else the model's
  // own), named, then "EOS"; and what greedy decoding writes.
  std::vector<std::int64_t> output;
  std::vector<std::string> output_names;
  std::vector<std::string> decoder_input_names;  // what the decoder reads: the start token, then the output
  std::string written, expected;  // as text; expected "" when the task has no example of the input
  std::vector<std::vector<std::size_t>> alignment;  // the true one on the input (empty: none)
  std::size_t held_out_sequences = 0;
  std::vector<std::vector<CrossHead>> layers;  // [decoder layer][head]
  // Per decoder layer, held out: the share of output tokens that some head's most weighted
  // position is aligned with (heads may share the work).
  std::vector<double> any_head_top1;
  // Self-attention on the input, [layer][head]: the encoder's (S, S) and the decoder's (T, T), NaN where masked.
  std::vector<std::vector<Array<double>>> encoder_attention, decoder_attention;
  TrainingHistory history;  // metrics.jsonl; empty unless the caller reads it (read_history)
};

// A typical source of the task: the first of a fixed stream at least 3/4 of the longest length.
std::vector<std::int64_t> typical_source(const Seq2SeqTask& task);

// Everything `qkv inspect` shows of a seq2seq run, for `source` (at most the model's max_src_len
// tokens) and `held_out` sources drawn as `qkv eval --seed seed` draws them.
AlignmentInspection inspect_alignment(const nn::EncoderDecoder& model, const Seq2SeqTask& task,
                                      const std::vector<std::int64_t>& source, const std::string& dir = "",
                                      std::size_t held_out = 256, std::uint64_t seed = 1);


}  // namespace qkv::analysis
