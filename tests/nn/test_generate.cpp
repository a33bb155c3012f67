#include "tests/helpers.hpp"

#include <map>

#include <xtensor/xview.hpp>

#include "qkv/core/autograd.hpp"
#include "qkv/nn/generate.hpp"
#include "qkv/optim/adam.hpp"

using namespace qkv;
using namespace qkv::nn;
using Catch::Matchers::Contains;

namespace {

TransformerConfig decoder_only(DType dtype) {
  return {.vocab_size = 9, .n_classes = 9, .max_len = 12, .layers = 2, .d_model = 16, .heads = 4, .kv_heads = 2,
          .mlp = true, .dtype = dtype};
}

EncoderDecoderConfig seq2seq(DType dtype) {
  return {.src_vocab = 7, .tgt_vocab = 8, .max_src_len = 6, .max_tgt_len = 7, .encoder_layers = 2, .decoder_layers = 2,
          .d_model = 16, .heads = 2, .mlp = true, .dtype = dtype};
}

}  // namespace

TEST_CASE("KV cache: one position at a time, or a few, gives forward's logits") {
  Generator gen(1);
  const Transformer model(decoder_only(DType::float64), gen);
  const IndexArray tokens{{1, 4, 0, 8, 3, 3, 7, 2}, {5, 5, 1, 0, 2, 6, 8, 4}};
  const Array<double> full = model.forward(tokens).logits.value<double>();
  std::vector<KVCache> cache;
  // Three positions, then one at a time.
  const Array<double> first = model.forward_cached(xt::view(tokens, xt::all(), xt::range(0, 3)), cache).logits.value<double>();
  CHECK(xt::allclose(first, xt::view(full, xt::all(), xt::range(0, 3)), 1e-12, 1e-12));
  for (std::size_t t = 3; t < 8; ++t) {
    const Array<double> step = model.forward_cached(xt::view(tokens, xt::all(), xt::range(t, t + 1)), cache).logits.value<double>();
    CHECK(xt::allclose(xt::view(step, xt::all(), 0), xt::view(full, xt::all(), t), 1e-12, 1e-12));
  }
  CHECK(cache[1].length() == 8);
  CHECK_THROWS_WITH(model.forward_cached(IndexArray{{1, 2, 3, 4, 5}}, cache), Contains("positions 8 to 13 are beyond max_len 12"));
  TransformerConfig bidirectional = decoder_only(DType::float64);
  bidirectional.causal_layers = {true, false};
  std::vector<KVCache> other;
  CHECK_THROWS_WITH(Transformer(bidirectional, gen).forward_cached(tokens, other), Contains("layer 1 is bidirectional"));
}

TEST_CASE("KV cache, fused: the decoder's steps read the memory's keys and values in place, and grow its own by a row") {
  Generator gen(4);
  const EncoderDecoder model(seq2seq(DType::float64), gen);
  const IndexArray source{{0, 3, 6, 4, 2, 5}, {4, 1, 0, 1, 3, 3}}, input{{7, 2, 1, 5, 3}, {7, 1, 4, 2, 2}};
  const MaskArray padding{{true, true, true, true, true, true}, {true, true, true, true, false, false}};
  const Array<double> full = model.forward(source, input, false, padding).logits.value<double>();
  NoGradGuard no_grad;  // no hooks, no weights: every attention in the fused kernel
  DecoderCache cache = model.start(model.encode(source, padding), padding);
  const double* memory_keys = nullptr;
  for (std::size_t t = 0; t < 5; ++t) {
    const Tensor step = model.decode(xt::view(input, xt::all(), xt::range(t, t + 1)), cache);
    CHECK(xt::allclose(step.value<double>(), xt::view(full, xt::all(), xt::range(t, t + 1)), 1e-12, 1e-12));
    CHECK(cache.self[0].length() == t + 1);
    CHECK(cache.cross[0].length() == 6);  // projected at the first step, never again
    if (t == 0) memory_keys = cache.cross[0].key_buffer().value<double>().data();
    CHECK(cache.cross[0].key_buffer().value<double>().data() == memory_keys);
  }
}

TEST_CASE("KV cache: the decoder one position at a time gives forward's logits, and projects the memory once") {
  Generator gen(2);
  EncoderDecoder model(seq2seq(DType::float64), gen);
  const IndexArray source{{0, 3, 6, 4, 2, 5}, {4, 1, 0, 1, 3, 3}}, input{{7, 2, 1, 5, 3}, {7, 1, 4, 2, 2}};
  const MaskArray padding{{true, true, true, true, true, true}, {true, true, true, true, false, false}};
  const Array<double> full = model.forward(source, input, false, padding).logits.value<double>();
  std::vector<std::size_t> projected;  // the memory positions cross-attention projects at each step
  model.add_hook("decoder.blocks.1.cross_attn.hook_k", [&](const Tensor& k, const std::string&) {
    projected.push_back(k.size(1));
    return k;
  });
  DecoderCache cache = model.start(model.encode(source, padding), padding);
  // One position, two, then one at a time.
  for (const auto& [from, to] : {std::pair<std::size_t, std::size_t>{0, 1}, {1, 3}, {3, 4}, {4, 5}}) {
    const Tensor step = model.decode(xt::view(input, xt::all(), xt::range(from, to)), cache);
    CHECK(xt::allclose(step.value<double>(), xt::view(full, xt::all(), xt::range(from, to)), 1e-12, 1e-12));
  }
  CHECK(projected == std::vector<std::size_t>{6, 0, 0, 0});
  CHECK(cache.length() == 5);
  CHECK(cache.cross[1].length() == 6);
  // A step that fails leaves the cache as it was, and the next one is right.
  DecoderCache again = model.start(model.encode(source, padding), padding);
  model.decode(xt::view(input, xt::all(), xt::range(0, 2)), again);
  model.add_hook("decoder.blocks.1.hook_attn_out", [](const Tensor&, const std::string&) -> Tensor {
    throw std::runtime_error("a hook that fails");
  });
  CHECK_THROWS_WITH(model.decode(xt::view(input, xt::all(), xt::range(2, 3)), again), "a hook that fails");
  CHECK(again.self[0].length() == 2);
  CHECK(again.self[1].length() == 2);
  model.reset_hooks();
  const Tensor step = model.decode(xt::view(input, xt::all(), xt::range(2, 3)), again);
  CHECK(xt::allclose(step.value<double>(), xt::view(full, xt::all(), xt::range(2, 3)), 1e-12, 1e-12));
  // A cache is made for one memory, and checked against it.
  const Tensor memory = model.encode(source, padding);
  CHECK_THROWS_WITH(model.start(memory, MaskArray{{true, true}, {true, false}}),
                    Contains("source padding of shape (2,2) for a memory of shape (2,6,16)"));
  CHECK_THROWS_WITH(model.start(reshape(memory, {12, 16})), Contains("a memory of shape (12,16)"));
  DecoderCache fresh = model.start(memory, padding);
  const IndexArray one = xt::zeros<std::int64_t>({1, 1});
  CHECK_THROWS_WITH(model.decode(one, fresh), Contains("a decoder input of 1 sequences for a memory of 2"));
  DecoderCache none;
  CHECK_THROWS_WITH(model.decode(one, none), Contains("EncoderDecoder::start did not make"));
}

TEST_CASE("generate: with and without the cache, the same tokens, greedy or sampled") {
  Generator init(3);
  const Transformer model(decoder_only(DType::float32), init);
  const IndexArray prompt{{1, 4, 0}, {5, 5, 1}, {8, 2, 2}};
  for (const Sampling& s : {Sampling{}, Sampling{.temperature = 1.0}, Sampling{.temperature = 0.7, .top_k = 3}}) {
    INFO("temperature " << s.temperature << ", top-k " << s.top_k);
    Generator a(11), b(11);
    const IndexArray cached = generate(model, prompt, 9, s, a, true), recomputed = generate(model, prompt, 9, s, b, false);
    CHECK(cached.shape() == std::vector<std::size_t>{3, 12});
    CHECK(cached == recomputed);
    const IndexArray start = xt::view(cached, xt::all(), xt::range(0, 3));
    CHECK(start == prompt);
  }
  EncoderDecoder seq(seq2seq(DType::float32), init);
  const IndexArray source{{0, 3, 6, 4, 2, 5}, {4, 1, 0, 1, 3, 3}};
  for (const Sampling& s : {Sampling{}, Sampling{.temperature = 1.5, .top_k = 4}}) {
    Generator a(12), b(12);
    const IndexArray cached = generate(seq, source, 7, 7, s, a, true), recomputed = generate(seq, source, 7, 7, s, b, false);
    CHECK(cached.shape() == std::vector<std::size_t>{2, 7});
    CHECK(cached == recomputed);
  }
  Generator g(1);
  CHECK_THROWS_WITH(generate(model, prompt, 10, {}, g), Contains("3 prompt tokens and 10 more pass the model's 12 positions"));
  CHECK_THROWS_WITH(generate(seq, source, 8, 3, {}, g), Contains("start token 8 is outside the decoder's vocabulary of 8"));
  CHECK_THROWS_WITH(next_tokens(Tensor(Array<float>({{1.0f, 2.0f}})), {.temperature = -1}, g), Contains("temperature -1"));
  CHECK_THROWS_WITH(next_tokens(Tensor(Array<double>({{1.0, NAN}})), {}, g), Contains("row 0 of the logits holds NaN"));
  CHECK_THROWS_WITH(next_tokens(Tensor(Array<double>({{-INFINITY, -INFINITY}})), {.temperature = 1}, g),
                    Contains("no finite value"));
  // A masked token (−inf) is never drawn.
  for (int i = 0; i < 200; ++i) CHECK(next_tokens(Tensor(Array<double>({{-INFINITY, 0.0, 0.0}})), {.temperature = 5}, g)(0, 0) != 0);
  TransformerConfig bidirectional = decoder_only(DType::float32);
  bidirectional.causal = false;
  CHECK_THROWS_WITH(generate(Transformer(bidirectional, g), prompt, 2, {}, g, false), Contains("layer 0 is bidirectional"));
}

TEST_CASE("next_tokens: greedy takes the largest logit, top-k draws only among the k largest, at softmax's rates") {
  Generator gen(5);
  const Tensor logits(Array<double>({{0.0, 2.0, 1.0, -1.0}, {3.0, 3.0, 0.0, 0.0}}));
  const IndexArray greedy = next_tokens(logits, {}, gen);
  CHECK(greedy(0, 0) == 1);
  CHECK(greedy(1, 0) == 0);  // a tie: the first
  std::map<std::int64_t, int> drawn;
  const int n = 20000;
  for (int i = 0; i < n; ++i) drawn[next_tokens(logits, {.temperature = 1.0, .top_k = 2}, gen)(0, 0)]++;
  CHECK(drawn.size() == 2);  // tokens 1 and 2 only
  const double p1 = std::exp(2.0) / (std::exp(2.0) + std::exp(1.0));  // 0.731
  CHECK(double(drawn[1]) / n == Approx(p1).margin(0.015));
  drawn.clear();
  for (int i = 0; i < n; ++i) drawn[next_tokens(logits, {.temperature = 2.0}, gen)(0, 0)]++;
  const double z = std::exp(0.0) + std::exp(1.0) + std::exp(0.5) + std::exp(-0.5);
  CHECK(double(drawn[3]) / n == Approx(std::exp(-0.5) / z).margin(0.01));  // 0.116
}
