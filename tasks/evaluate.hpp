#pragma once
// A model scored on a task: on fresh held-out sequences, from a stream no training batch draws from.
#include <cstdint>

#include "qkv/core/random.hpp"
#include "qkv/nn/seq2seq.hpp"
#include "qkv/nn/transformer.hpp"
#include "qkv/tasks/dataset.hpp"
#include "qkv/tasks/task.hpp"

namespace qkv::tasks {

// The key-padding mask of a batch, (B, T) false at the task's pad token, when the model has a
// bidirectional layer (where real queries would see the padding); 0-d otherwise (a causal query
// never sees the padding after it).
MaskArray key_padding(const nn::Transformer& model, const Task& task, const IndexArray& tokens, bool mask_padding = true);

// The generator of the held-out sequences of `seed`: a stream no training batch draws from.
Generator held_out_generator(std::uint64_t seed);
// `n` unpadded held-out sequences of the task, drawn one at a time from a stream of `seed`, the same
// for a task and seed whatever else asks: what a sweep's measurements and inspect's head detectors
// read.
std::vector<std::vector<std::int64_t>> held_out_sequences(const Task& task, std::size_t n, std::uint64_t seed);

// The source padding of a seq2seq batch, (B, S) false at the task's source_pad: no query attends it.
MaskArray source_padding(const Task& task, const IndexArray& source);

// A forward on a batch: the predictions at each position and, for a training step, the loss (with
// `loss`; else undefined). A batch scored at its last position alone runs Transformer::forward_last
// (its predictions elsewhere are -1). A decoder-only model masks the padding keys as key_padding says; an
// encoder-decoder masks the source's padding.
struct Forward {
  Tensor loss;
  IndexArray predictions;
};
Forward forward(const nn::Transformer& model, const Task& task, const Batch& batch, bool mask_padding, bool loss);
Forward forward(const nn::EncoderDecoder& model, const Task& task, const Batch& batch, bool mask_padding, bool loss);

// A decoder-only model's metrics and mean loss (over the scored positions) on `rows`, a data-set
// task's split say, read in chunks of at most 4096 rows.
struct RowsScore {
  Metrics metrics;
  double loss = 0;
};
RowsScore score_rows(const nn::Transformer& model, const Task& task, const Batch& rows, bool mask_padding = true);

// Accuracy of `model` on `batches` fresh batches drawn from held_out_generator(seed); a seq2seq
// model's with teacher forcing (each position given the right output before it). A data-set task's
// is on its whole held-out split, whatever `batches` and `batch_size` say.
Metrics evaluate(const nn::Transformer& model, const Task& task, std::size_t batches, std::size_t batch_size, std::uint64_t seed,
                 bool mask_padding = true);
Metrics evaluate(const nn::EncoderDecoder& model, const Task& task, std::size_t batches, std::size_t batch_size,
                 std::uint64_t seed, bool mask_padding = true);
// Accuracy of a decoder-only `model` on the sequences of a data set (read_dataset).
Metrics evaluate(const nn::Transformer& model, const Task& task, const Dataset& data, bool mask_padding = true);
// The same sequences decoded greedily with the KV cache, from the start token alone: a position is
// right when the generated token is the output's (or the end token after it), a sequence when all
// are, up to its end token. (Equal to teacher forcing's exact match, but for ties of the logits.)
Metrics evaluate_generation(const nn::EncoderDecoder& model, const Seq2SeqTask& task, std::size_t batches,
                            std::size_t batch_size, std::uint64_t seed);

}  // namespace qkv::tasks
