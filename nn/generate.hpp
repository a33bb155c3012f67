#pragma once
// Decoding: a decoder-only Transformer continues its prompt, an EncoderDecoder writes the output
// for its source, one token at a time; greedily, or by sampling with a temperature and top-k.
//
// With the KV cache (the default) each step runs the model on the new token alone: the keys and
// values of the positions before it come from the cache, which grows by one row a step, and an
// EncoderDecoder's cross-attention projects the encoder's memory once per sequence. Without it,
// each step runs the model on the whole sequence so far. Both compute the same logits, up to
// rounding (a cached step's single query sums its softmax in another order than the full
// forward's; in float32 they may differ in the last bits, and a near-tie could then go either way).
#include <cstdint>

#include "qkv/core/random.hpp"
#include "qkv/nn/seq2seq.hpp"
#include "qkv/nn/transformer.hpp"

namespace qkv::nn {

struct Sampling {
  // 0: greedy (the most likely token, the first on a tie). Otherwise the logits are divided by
  // it, and a token is drawn from their softmax.
  double temperature = 0;
  std::size_t top_k = 0;  // with a temperature: draw among the k most likely tokens only (0: all)
};

// The next token of each row of logits (B, V), drawn from `gen` when sampling. Throws
// std::invalid_argument for a negative or non-finite temperature, or a row with NaN, +inf or no
// finite logit (−inf, a masked token, is never drawn).
IndexArray next_tokens(const Tensor& logits, const Sampling& sampling, Generator& gen);

// The prompt (B, T0) followed by `count` generated tokens: (B, T0 + count). The model must be
// causal with the token readout, its classes its tokens (n_classes = vocab_size), and T0 + count
// within max_len (else std::invalid_argument).
IndexArray generate(const Transformer& model, const IndexArray& prompt, std::size_t count, const Sampling& sampling,
                    Generator& gen, bool use_cache = true);

// The decoder's output for `source` (B, S): `count` tokens after the start token, which the
// decoder reads first (the start token is not part of the result): (B, count), count ≤ max_tgt_len.
IndexArray generate(const EncoderDecoder& model, const IndexArray& source, std::int64_t start, std::size_t count,
                    const Sampling& sampling, Generator& gen, bool use_cache = true,
                    const MaskArray& source_padding = MaskArray());

}  // namespace qkv::nn
