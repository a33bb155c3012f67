#include "qkv/nn/generate.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include <xtensor/xview.hpp>

#include "qkv/core/autograd.hpp"
#include "qkv/core/ops.hpp"
#include "qkv/core/shape.hpp"

namespace qkv::nn {

namespace {

// The last position's logits of (B, T, V), as (B, V) in float64.
Array<double> last_logits(const Tensor& logits) {
  const Tensor last = logits.to(DType::float64);
  return xt::view(last.value<double>(), xt::all(), last.size(1) - 1, xt::all());
}

// (B, T) then (B, 1): side by side.
IndexArray appended(const IndexArray& tokens, const IndexArray& next) {
  IndexArray out = IndexArray::from_shape({tokens.shape()[0], tokens.shape()[1] + 1});
  xt::view(out, xt::all(), xt::range(0, tokens.shape()[1])) = tokens;
  xt::view(out, xt::all(), tokens.shape()[1]) = xt::view(next, xt::all(), 0);
  return out;
}

}  // namespace

IndexArray next_tokens(const Tensor& logits, const Sampling& sampling, Generator& gen) {
  if (logits.dim() != 2) fail("generate", "logits of shape {}: expected (batch, vocabulary)", to_string(logits.shape()));
  if (!(sampling.temperature >= 0) || !std::isfinite(sampling.temperature))
    fail("generate", "temperature {}: it must be finite and not negative", sampling.temperature);
  const Tensor as64 = logits.to(DType::float64);
  const Array<double>& l = as64.value<double>();
  const std::size_t B = l.shape()[0], V = l.shape()[1];
  IndexArray out = IndexArray::from_shape({B, 1});
  std::vector<std::size_t> order(V);
  std::vector<double> p(V);
  for (std::size_t b = 0; b < B; ++b) {
    const double* row = &l(b, 0);
    if (std::any_of(row, row + V, [](double v) { return std::isnan(v) || v == INFINITY; }) ||
        std::none_of(row, row + V, [](double v) { return std::isfinite(v); }))
      fail("generate", "row {} of the logits holds NaN, +inf or no finite value: no token to choose", b);
    if (sampling.temperature == 0) {
      out(b, 0) = std::int64_t(std::max_element(row, row + V) - row);
      continue;
    }
    // The k most likely (all for 0), their softmax at the temperature, and one draw.
    std::iota(order.begin(), order.end(), 0);
    const std::size_t k = sampling.top_k == 0 ? V : std::min(sampling.top_k, V);
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t c) { return row[a] > row[c]; });
    double total = 0;
    for (std::size_t i = 0; i < k; ++i) total += p[i] = std::exp((row[order[i]] - row[order[0]]) / sampling.temperature);
    double u = gen.uniform() * total;
    std::size_t pick = 0;  // the likeliest, should rounding leave u ≥ 0 after every token
    for (std::size_t i = 0; i < k; ++i)
      if ((u -= p[i]) < 0) {
        pick = i;
        break;
      }
    out(b, 0) = std::int64_t(order[pick]);
  }
  return out;
}

IndexArray generate(const Transformer& model, const IndexArray& prompt, std::size_t count, const Sampling& sampling,
                    Generator& gen, bool use_cache) {
  model.check_decodable();
  const TransformerConfig& c = model.config();
  if (c.n_classes != c.vocab_size)
    fail("generate", "the model's {} classes are not its {} tokens: it does not predict the next token",
         c.n_classes, c.vocab_size);
  if (prompt.dimension() != 2 || prompt.shape()[1] == 0)
    fail("generate", "a prompt of shape {}: expected (batch, at least one position)", to_string(to_shape(prompt.shape())));
  if (prompt.shape()[1] + count > c.max_len)
    fail("generate", "{} prompt tokens and {} more pass the model's {} positions", prompt.shape()[1], count, c.max_len);
  NoGradGuard no_grad;
  IndexArray tokens = prompt;
  std::vector<KVCache> cache;
  IndexArray step = prompt;  // what the cached model reads next
  for (std::size_t i = 0; i < count; ++i) {
    const Tensor logits = use_cache ? model.forward_cached(step, cache).logits : model.forward(tokens).logits;
    const Array<double> last = last_logits(logits);
    step = next_tokens(Tensor(last), sampling, gen);
    tokens = appended(tokens, step);
  }
  return tokens;
}

IndexArray generate(const EncoderDecoder& model, const IndexArray& source, std::int64_t start, std::size_t count,
                    const Sampling& sampling, Generator& gen, bool use_cache, const MaskArray& source_padding) {
  const EncoderDecoderConfig& c = model.config();
  if (start < 0 || std::size_t(start) >= c.tgt_vocab)
    fail("generate", "start token {} is outside the decoder's vocabulary of {}", start, c.tgt_vocab);
  if (count > c.max_tgt_len) fail("generate", "{} tokens pass the decoder's {} positions", count, c.max_tgt_len);
  NoGradGuard no_grad;
  DecoderCache cache = model.start(model.encode(source, source_padding), source_padding);
  IndexArray input = IndexArray::from_shape({source.shape()[0], 1});
  input.fill(start);
  IndexArray step = input;
  for (std::size_t i = 0; i < count; ++i) {
    const Tensor logits = use_cache ? model.decode(step, cache) : model.forward(source, input, false, source_padding).logits;
    step = next_tokens(Tensor(last_logits(logits)), sampling, gen);
    input = appended(input, step);
  }
  return xt::view(input, xt::all(), xt::range(1, count + 1));
}

}  // namespace qkv::nn
