#include "qkv/analysis/alignment.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <xtensor/xview.hpp>

#include "qkv/analysis/inspect.hpp"
#include "qkv/tasks/evaluate.hpp"
#include "qkv/core/autograd.hpp"
#include "qkv/nn/circuits.hpp"
#include "qkv/nn/files.hpp"
#include "qkv/nn/generate.hpp"

namespace qkv::analysis {

using namespace tasks;

double alignment_score(const Array<double>& weights, const std::vector<std::vector<std::size_t>>& alignment) {
  if (weights.dimension() != 2 || alignment.size() > weights.shape()[0])
    fail("alignment_score", "weights of shape {} for an alignment of {} output tokens", to_string(to_shape(weights.shape())),
         alignment.size());
  if (alignment.empty()) return 0;
  double total = 0;
  for (std::size_t t = 0; t < alignment.size(); ++t)
    for (std::size_t j : alignment[t]) {
      if (j >= weights.shape()[1]) fail("alignment_score", "output token {} aligned with source position {} of {}", t, j, weights.shape()[1]);
      total += weights(t, j);
    }
  return total / double(alignment.size());
}

bool top_aligned(const Array<double>& weights, const std::vector<std::vector<std::size_t>>& alignment, std::size_t t) {
  const auto row = xt::view(weights, t, xt::all());
  const std::size_t top = std::size_t(std::max_element(row.begin(), row.end()) - row.begin());
  return std::find(alignment.at(t).begin(), alignment[t].end(), top) != alignment[t].end();
}

std::vector<std::int64_t> typical_source(const Seq2SeqTask& task) {
  Generator gen(2024);
  const std::size_t want = (3 * task.sides().max_source_len + 3) / 4;
  std::vector<std::int64_t> source;
  for (int attempt = 0; attempt < 1000 && source.size() < want; ++attempt) source = task.draw(gen).source;
  return source;
}

namespace {

// Over `n` held-out sources, teacher forced, in batches of 64: each head's alignment score and
// share of output tokens whose most weighted position is aligned ([layer][head]), and each layer's
// share that some head's is.
struct HeldOut {
  std::vector<std::vector<double>> score, top1;
  std::vector<double> any_top1;
};

HeldOut held_out_scores(const nn::EncoderDecoder& model, const Seq2SeqTask& task, std::size_t n, std::uint64_t seed) {
  const nn::EncoderDecoderConfig& c = model.config();
  const std::size_t L = c.decoder_layers, H = c.heads;
  HeldOut r{std::vector<std::vector<double>>(L, std::vector<double>(H, 0.0)),
            std::vector<std::vector<double>>(L, std::vector<double>(H, 0.0)), std::vector<double>(L, 0.0)};
  std::size_t tokens = 0;
  Generator gen = held_out_generator(seed);
  for (std::size_t done = 0; done < n;) {
    std::vector<Seq2SeqExample> examples;
    for (; examples.size() < 64 && done < n; ++done) examples.push_back(task.draw(gen));
    const Batch b = task.batch(examples);
    const nn::EncoderDecoderOutput f = model.forward(b.source, b.tokens, true, source_padding(task, b.source));
    for (const Seq2SeqExample& e : examples) tokens += e.alignment.size();
    for (std::size_t l = 0; l < L; ++l) {
      const Array<double> w = f.cross_attention[l].weights.to(DType::float64).value<double>();  // (B, H, T, S)
      for (std::size_t i = 0; i < examples.size(); ++i) {
        const auto& alignment = examples[i].alignment;
        std::vector<bool> any(alignment.size(), false);
        for (std::size_t h = 0; h < H; ++h) {
          const Array<double> head = xt::view(w, i, h);
          r.score[l][h] += alignment_score(head, alignment) / double(n);
          for (std::size_t t = 0; t < alignment.size(); ++t)
            if (top_aligned(head, alignment, t)) {
              r.top1[l][h] += 1;
              any[t] = true;
            }
        }
        r.any_top1[l] += double(std::count(any.begin(), any.end(), true));
      }
    }
  }
  for (std::size_t l = 0; l < L; ++l) {
    for (double& v : r.top1[l]) v /= double(tokens);
    r.any_top1[l] /= double(tokens);
  }
  return r;
}

}  // namespace

AlignmentInspection inspect_alignment(const nn::EncoderDecoder& model, const Seq2SeqTask& task,
                                      const std::vector<std::int64_t>& source, const std::string& dir, std::size_t held_out,
                                      std::uint64_t seed) {
  const nn::EncoderDecoderConfig& c = model.config();
  if (source.empty()) fail("inspect", "the source holds no tokens");
  if (source.size() > c.max_src_len)
    fail("inspect", "the source holds {} tokens, but the model has {} source positions", source.size(), c.max_src_len);
  if (held_out == 0) fail("inspect", "no held-out sequences to score the alignment on");
  NoGradGuard no_grad;
  const Seq2SeqInfo& sides = task.sides();
  AlignmentInspection r;
  r.task = task.info().name;
  r.dir = dir;
  r.config = c;
  r.source = source;
  for (std::int64_t t : source) r.source_names.push_back(task.source_token_name(t));
  // What greedy decoding writes, up to its end token.
  Generator unused(0);
  const IndexArray written = nn::generate(model, one_row(source), sides.start, c.max_tgt_len, {}, unused);
  std::vector<std::int64_t> own;
  for (std::int64_t t : written) {
    if (t == sides.end || own.size() + 1 >= c.max_tgt_len) break;
    own.push_back(t);
  }
  r.written = task.decode(own);
  if (const auto e = task.example(source); e && e->output.size() < c.max_tgt_len) {
    r.output = e->output;
    r.expected = task.decode(e->output);
    r.alignment = e->alignment;
  } else {
    r.output = own;  // the model's own output: no true alignment to score
  }
  r.decoder_input_names.push_back(task.token_name(sides.start));
  for (std::int64_t t : r.output) r.output_names.push_back(task.token_name(t));
  r.decoder_input_names.insert(r.decoder_input_names.end(), r.output_names.begin(), r.output_names.end());
  r.output_names.push_back(task.token_name(sides.end));

  std::vector<std::int64_t> decoder_input = {sides.start};
  decoder_input.insert(decoder_input.end(), r.output.begin(), r.output.end());
  const nn::EncoderDecoderOutput f = model.forward(one_row(source), one_row(decoder_input), true);
  r.held_out_sequences = held_out;
  const HeldOut scores = held_out_scores(model, task, held_out, seed);
  r.any_head_top1 = scores.any_top1;
  for (std::size_t l = 0; l < c.decoder_layers; ++l) {
    std::vector<CrossHead> heads;
    for (std::size_t h = 0; h < c.heads; ++h) {
      CrossHead x{.layer = l, .head = h, .weights = head_matrix(f.cross_attention[l].weights, h), .on_input = std::nullopt,
                  .held_out = scores.score[l][h], .top1 = scores.top1[l][h], .sigma = nn::symmetric_share(nn::qk_circuit(model.decoder[l]->cross_attn, h))};
      if (!r.alignment.empty()) x.on_input = alignment_score(x.weights, r.alignment);
      heads.push_back(std::move(x));
    }
    r.layers.push_back(std::move(heads));
  }
  const auto self = [&](const std::vector<nn::AttentionResult>& results) {
    std::vector<std::vector<Array<double>>> out;
    for (const nn::AttentionResult& a : results) {
      out.emplace_back();
      for (std::size_t h = 0; h < c.heads; ++h)
        out.back().push_back(masked_weights(head_matrix(a.weights, h), head_matrix(a.scores, h)));
    }
    return out;
  };
  r.encoder_attention = self(f.encoder_attention);
  r.decoder_attention = self(f.decoder_attention);
  return r;
}

}  // namespace qkv::analysis
