#include "qkv/report/alignment.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <ostream>

#include <fmt/format.h>
#include <xtensor/xview.hpp>

#include "qkv/nn/files.hpp"
#include "qkv/report/heatmap.hpp"
#include "qkv/report/inspect.hpp"

namespace qkv::report {

using namespace tasks;

using namespace analysis;

namespace {


std::string score_text(const std::optional<double>& v) { return v ? fmt::format("{:.3f}", *v) : "-"; }

std::string config_text(const nn::EncoderDecoderConfig& c) {
  return fmt::format("encoder {} layer{}, decoder {} layer{}, {} head{}, d_model {}{}{}{}", c.encoder_layers,
                     c.encoder_layers == 1 ? "" : "s", c.decoder_layers, c.decoder_layers == 1 ? "" : "s", c.heads,
                     c.heads == 1 ? "" : "s", c.d_model, c.mlp ? ", MLPs" : "",
                     c.qk == nn::QK::tied ? ", W_k = W_q" : "",
                     projection_text(c.proj));
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
  std::vector<std::pair<std::string, std::string>> svgs;
  for (const auto& [name, map] : pictures(in)) svgs.emplace_back(name, heatmap_svg(map));
  for (auto& chart : training_charts(in.history)) svgs.push_back(std::move(chart));
  return write_svg_files(dir, svgs);
}

}  // namespace qkv::report
