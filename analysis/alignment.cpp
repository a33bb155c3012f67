#include "qkv/analysis/alignment.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <ostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <xtensor/xview.hpp>

#include "qkv/report/heatmap.hpp"
#include "qkv/analysis/inspect.hpp"
#include "qkv/training/train.hpp"
#include "qkv/core/autograd.hpp"
#include "qkv/nn/circuits.hpp"
#include "qkv/nn/files.hpp"
#include "qkv/nn/generate.hpp"

namespace qkv::cli {

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

std::string head_label(std::size_t layer, std::size_t head) { return fmt::format("L{}H{}", layer, head); }

std::string score_text(const std::optional<double>& v) { return v ? fmt::format("{:.3f}", *v) : "-"; }

std::string config_text(const nn::EncoderDecoderConfig& c) {
  return fmt::format("encoder {} layer{}, decoder {} layer{}, {} head{}, d_model {}{}{}{}", c.encoder_layers,
                     c.encoder_layers == 1 ? "" : "s", c.decoder_layers, c.decoder_layers == 1 ? "" : "s", c.heads,
                     c.heads == 1 ? "" : "s", c.d_model, c.mlp ? ", MLPs" : "",
                     c.qk == nn::QK::tied ? ", W_k = W_q" : "",
                     c.proj == nn::Projection::identity ? ", identity projections"
                     : c.proj == nn::Projection::frozen ? ", frozen projections" : "");
}

// The cross-attention picture of a head, the true alignment outlined.
Heatmap cross_map(const AlignmentInspection& in, const CrossHead& h) {
  Heatmap map{h.weights, in.output_names, in.source_names,
              fmt::format("{} cross-attention{}", head_label(h.layer, h.head),
                          h.on_input ? fmt::format(": {:.3f} on the alignment", *h.on_input) : ""),
              false, "output", "source", true};
  for (std::size_t t = 0; t < in.alignment.size(); ++t)
    for (std::size_t j : in.alignment[t]) map.marked.emplace_back(t, j);
  if (!in.alignment.empty()) map.marked_legend = "outlined: the true alignment";
  return map;
}

// Every picture, named as write_svgs names its file.
std::vector<std::pair<std::string, Heatmap>> pictures(const AlignmentInspection& in) {
  std::vector<std::pair<std::string, Heatmap>> out;
  for (const auto& heads : in.layers)
    for (const CrossHead& h : heads) out.emplace_back(head_label(h.layer, h.head) + "-cross-attention", cross_map(in, h));
  const auto self = [&](const char* side, const std::vector<std::vector<Array<double>>>& maps,
                        const std::vector<std::string>& names) {
    for (std::size_t l = 0; l < maps.size(); ++l)
      for (std::size_t h = 0; h < maps[l].size(); ++h)
        out.emplace_back(fmt::format("{}-{}-attention", side, head_label(l, h)),
                         Heatmap{maps[l][h], names, names, fmt::format("{} {} self-attention", side, head_label(l, h)), false,
                                 "query", "key", true});
  };
  self("encoder", in.encoder_attention, in.source_names);
  self("decoder", in.decoder_attention, in.decoder_input_names);
  return out;
}

std::string legend(const AlignmentInspection& in) {
  return fmt::format(
      "Cross-attention: row t is the decoder's query that writes output token t (the last row writes the end token), "
      "column j the source position j; the decoder reads the right output before each row (teacher forcing). The "
      "alignment score is the share of its weight a query puts on the source positions its output token comes from, "
      "averaged over the output tokens: 1 for a head that looks only there, about 1/{} for one that spreads its "
      "weight evenly. Top-1 aligned: the share of output tokens whose most weighted source position is an aligned one "
      "(for any head: one of the layer's heads'). Held out: over {} sources as qkv eval draws them. σ is the symmetric share of W_q W_kᵀ: 1 for "
      "tied or identity projections, which in cross-attention still compare two different streams (the decoder's "
      "queries, the encoder's keys).",
      in.source.size(), in.held_out_sequences);
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

nlohmann::json to_json(const AlignmentInspection& in) {
  nlohmann::json cross = nlohmann::json::array();
  for (const auto& heads : in.layers)
    for (const CrossHead& h : heads)
      cross.push_back({{"layer", h.layer}, {"head", h.head}, {"weights", matrix_json(h.weights)},
                       {"alignment_on_input", h.on_input ? nlohmann::json(*h.on_input) : nlohmann::json()},
                       {"alignment_held_out", h.held_out}, {"top1_held_out", h.top1}, {"sigma", h.sigma}});
  const auto matrices = [](const std::vector<std::vector<Array<double>>>& maps) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& layer : maps) {
      out.push_back(nlohmann::json::array());
      for (const Array<double>& m : layer) out.back().push_back(matrix_json(m));
    }
    return out;
  };
  return {{"task", in.task},
          {"dir", in.dir},
          {"config", nlohmann::json::parse(nn::to_json(in.config))},
          {"source", {{"tokens", in.source}, {"names", in.source_names}}},
          {"output", {{"tokens", in.output}, {"names", in.output_names}, {"written", in.written}, {"expected", in.expected}}},
          {"alignment", in.alignment},
          {"held_out_sequences", in.held_out_sequences},
          {"cross_attention", cross},
          {"any_head_top1", in.any_head_top1},
          {"encoder_attention", matrices(in.encoder_attention)},
          {"decoder_attention", matrices(in.decoder_attention)}};
}

void print_report(std::ostream& out, const AlignmentInspection& in, bool color) {
  const auto bold = [&](const std::string& s) { return color ? "\x1b[1m" + s + "\x1b[0m" : s; };
  out << bold(fmt::format("qkv inspect {}: {}, {}", in.dir, in.task, config_text(in.config))) << "\n";
  std::string source;
  for (const std::string& name : in.source_names) source += (source.empty() ? "" : " ") + name;
  out << "source:  " << source << "\n";
  out << "written: " << in.written;
  if (!in.expected.empty()) out << (in.written == in.expected ? "  (right)" : "  (expected: " + in.expected + ")");
  out << "\n\n" << legend(in) << "\n\n";
  out << "                weight on the alignment    top-1 aligned\nlayer head      on input    held out       held out   σ of W_q W_kᵀ\n";
  for (std::size_t l = 0; l < in.layers.size(); ++l) {
    for (const CrossHead& h : in.layers[l])
      out << fmt::format("{:>5} {:>4}  {:>12}  {:>10.3f}  {:>13.3f}  {:>14.3f}\n", h.layer, h.head, score_text(h.on_input),
                         h.held_out, h.top1, h.sigma);
    out << fmt::format("{:>5} {:>4}  {:>12}  {:>10}  {:>13.3f}\n", l, "any", "", "", in.any_head_top1[l]);
  }
  for (const auto& heads : in.layers)
    for (const CrossHead& h : heads) out << "\n" << heatmap_text(cross_map(in, h), color);
}

std::string to_html(const AlignmentInspection& in) {
  std::string s = page_start("qkv inspect" + (in.dir.empty() ? "" : " " + in.dir));
  std::string source;
  for (const std::string& name : in.source_names) source += (source.empty() ? "" : " ") + name;
  s += fmt::format("<h1>qkv inspect: {} ({})</h1>\n", escape_xml(in.task), escape_xml(config_text(in.config)));
  s += fmt::format("<p>Source: <code>{}</code><br>Written: <code>{}</code>{}</p>\n", escape_xml(source),
                   escape_xml(in.written),
                   in.expected.empty()             ? ""
                   : in.written == in.expected ? " (right)"
                                                   : fmt::format(" (expected <code>{}</code>)", escape_xml(in.expected)));
  s += fmt::format("<div class=\"legend\"><p>{} Green outlines mark the true alignment. Hover over a cell for its "
                   "value.</p></div>\n",
                   escape_xml(legend(in)));
  s += "<table><tr><th>layer</th><th>head</th><th>weight on the alignment, on the input</th><th>held out</th>"
       "<th>top-1 aligned, held out</th><th>σ of W_q W_kᵀ</th></tr>\n";
  for (std::size_t l = 0; l < in.layers.size(); ++l) {
    for (const CrossHead& h : in.layers[l])
      s += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.3f}</td><td>{:.3f}</td><td>{:.3f}</td></tr>\n", h.layer,
                       h.head, score_text(h.on_input), h.held_out, h.top1, h.sigma);
    s += fmt::format("<tr><td>{}</td><td>any</td><td></td><td></td><td>{:.3f}</td><td></td></tr>\n", l, in.any_head_top1[l]);
  }
  s += "</table>\n" + training_html(in.history);
  std::string section;
  for (const auto& [name, map] : pictures(in)) {
    const std::string kind = name.ends_with("cross-attention") ? "Cross-attention"
                             : name.starts_with("encoder")      ? "The encoder's self-attention"
                                                                : "The decoder's self-attention (causal)";
    if (kind != section) {
      s += (section.empty() ? "" : "</div>\n") + fmt::format("<h2>{}</h2>\n<div class=\"pics\">\n", kind);
      section = kind;
    }
    s += heatmap_svg(map);
  }
  s += "</div>\n</body></html>\n";
  return s;
}

std::vector<std::string> write_svgs(const AlignmentInspection& in, const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::vector<std::string> files;
  const auto write = [&](const std::string& name, const std::string& svg) {
    files.push_back((std::filesystem::path(dir) / (name + ".svg")).string());
    nn::write_atomically(files.back(), svg);
  };
  for (const auto& [name, map] : pictures(in)) write(name, heatmap_svg(map));
  for (const auto& [name, svg] : training_charts(in.history)) write(name, svg);
  return files;
}

}  // namespace qkv::cli
