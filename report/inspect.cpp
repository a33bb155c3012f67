#include "qkv/report/inspect.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <ostream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <xtensor/xview.hpp>

#include "qkv/nn/files.hpp"
#include "qkv/report/charts.hpp"
#include "qkv/report/explore.hpp"
#include "qkv/report/heatmap.hpp"

namespace qkv::report {

using namespace tasks;

using namespace analysis;

std::string projection_text(nn::Projection proj) {
  switch (proj) {
    case nn::Projection::identity: return ", identity projections";
    case nn::Projection::identity_qk: return ", W_q = W_k = I";
    case nn::Projection::frozen: return ", frozen projections";
    case nn::Projection::learned: break;
  }
  return "";
}

nlohmann::json matrix_json(const Array<double>& a) {
  nlohmann::json rows = nlohmann::json::array();
  for (std::size_t i = 0; i < a.shape()[0]; ++i) {
    nlohmann::json row = nlohmann::json::array();
    for (std::size_t j = 0; j < a.shape()[1]; ++j) {
      const double v = a(i, j);
      row.push_back(std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr));  // masked: null
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::string page_start(const std::string& title) {
  return R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>)" + escape_xml(title) +
         R"(</title>
<style>
body { font-family: "DejaVu Sans", sans-serif; margin: 1.5em; color: #222; max-width: 1400px; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-top: 1px solid #ccc; padding-top: .6em; }
table { border-collapse: collapse; font-size: .9em; } td, th { padding: 2px 8px; text-align: right; }
th { border-bottom: 1px solid #999; } .pics { display: flex; flex-wrap: wrap; gap: 18px; align-items: flex-start; }
.legend { font-size: .9em; max-width: 60em; } code { background: #f3f3f3; padding: 0 3px; }
nav.heads { position: sticky; top: 0; background: #fff; padding: .4em 0; border-bottom: 1px solid #ccc; z-index: 1; }
nav.heads span { margin-right: 1.5em; } nav.heads a { margin-left: .5em; } nav.heads a.shown { font-weight: bold; color: #222; }
.strip { margin: .3em 0; line-height: 1.9; } .strip span { padding: 1px 4px; border-radius: 3px; cursor: default; }
.strip span.hovered { outline: 2px solid #222; } #explore-step { width: 24em; vertical-align: middle; }
</style></head><body>
)";
}

namespace {

nlohmann::json eigen_json(const std::vector<std::complex<double>>& values) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& v : values) out.push_back({v.real(), v.imag()});
  return out;
}

std::vector<std::string> numbered(std::size_t n) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < n; ++i) out.push_back(std::to_string(i));
  return out;
}

// Eigenvalues that are not rounding noise: |λ| above 1e-9 of the largest.
std::vector<std::complex<double>> significant(const std::vector<std::complex<double>>& values) {
  std::vector<std::complex<double>> out;
  const double top = values.empty() ? 0 : std::abs(values.front());
  for (const auto& v : values)
    if (std::abs(v) > 1e-9 * top) out.push_back(v);
  return out;
}

std::string complex_text(std::complex<double> v) {
  if (std::abs(v.imag()) <= 1e-12 * std::abs(v)) return fmt::format("{:.3g}", v.real());
  return fmt::format("{:.3g}{}{:.3g}i", v.real(), v.imag() < 0 ? "-" : "+", std::abs(v.imag()));
}

// Conjugate pairs as a±bi, once.
std::string eigen_text(const std::vector<std::complex<double>>& values) {
  std::string out;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto v = values[i];
    if (!out.empty()) out += "  ";
    if (std::abs(v.imag()) > 1e-12 * std::abs(v) && i + 1 < values.size() && values[i + 1] == std::conj(v)) {
      out += fmt::format("{:.3g}±{:.3g}i", v.real(), std::abs(v.imag()));
      ++i;
    } else {
      out += complex_text(v);
    }
  }
  return out;
}

std::string values_text(const std::vector<double>& values, std::size_t n) {
  std::string out;
  for (std::size_t i = 0; i < std::min(n, values.size()); ++i) out += fmt::format("{}{:.3g}", i ? " " : "", values[i]);
  return out;
}

std::string shape_text(const Shape& s) { return fmt::format("{}×{}", s.at(0), s.at(1)); }

const char* const matrix_names[] = {"W_q", "W_k", "W_v", "W_o"};

std::string head_name(const HeadInspection& h) { return fmt::format("layer {} head {}", h.layer, h.head); }

// "causal", "bidirectional", or per layer "causal, bidirectional".
// Each layer's mask: true for causal.
std::vector<bool> layer_masks(const nn::TransformerConfig& c) {
  std::vector<bool> masks;
  for (std::size_t l = 0; l < c.layers; ++l) masks.push_back(nn::layer_is_causal(c, l));
  return masks;
}

std::string masks_text(const nn::TransformerConfig& c) {
  if (c.causal_layers.empty()) return c.causal ? "causal" : "bidirectional";
  std::vector<std::string> names;
  for (bool causal : layer_masks(c)) names.push_back(causal ? "causal" : "bidirectional");
  return fmt::format("{}", fmt::join(names, ", "));
}

// Attention weights (T, T) on a sequence of tokens `names`, NaN where masked.
Heatmap attention_map(const Array<double>& weights, const std::vector<std::string>& names, const std::string& title) {
  return {weights, names, names, title, false, "query", "key", true};
}

// The four pictures of a head, as the HTML page and the SVG files show them.
std::vector<std::pair<std::string, Heatmap>> pictures(const Inspection& in, const HeadInspection& h) {
  const std::size_t d_model = h.qk.shape()[0];
  // Masked cells drawn as such: where the score is −inf, and, for a causal model, the
  // positions after the query's.
  const Array<double> attention = masked_weights(h.attention, h.scores);
  Array<double> positions = h.position_qk;
  if (nn::layer_is_causal(in.config, h.layer))
    for (std::size_t i = 0; i < positions.shape()[0]; ++i)
      for (std::size_t j = i + 1; j < positions.shape()[1]; ++j) positions(i, j) = NAN;
  return {
      {"attention", attention_map(attention, in.input_names, fmt::format("L{}H{} attention on the input", h.layer, h.head))},
      {"token-qk", {h.token_qk, in.vocabulary, in.vocabulary, fmt::format("L{}H{} token QK", h.layer, h.head), true,
                    "query token", "key token"}},
      {"position-qk", {positions, numbered(positions.shape()[0]), numbered(positions.shape()[1]),
                       fmt::format("L{}H{} position QK", h.layer, h.head), true, "query position", "key position"}},
      {"qk-circuit", {h.qk, numbered(d_model), numbered(d_model), fmt::format("L{}H{} QK circuit A = W_q W_kᵀ", h.layer, h.head),
                      true, "row", "column"}},
  };
}


// The composition table's rows, "L0H1 → L1H0", each kind's score, and the largest score's
// kind and row; a line on what the scores mean.
struct CompositionRow {
  std::string from, to;
  double scores[3];
};
constexpr const char* composition_kinds[] = {"Q", "K", "V"};

std::vector<CompositionRow> composition_rows(const Inspection& in) {
  std::vector<CompositionRow> rows;
  for (const HeadComposition& x : in.composition)
    rows.push_back({head_label(x.from_layer, x.from_head), head_label(x.to_layer, x.to_head), {x.q, x.k, x.v}});
  return rows;
}

// The (row, kind) of the largest score.
std::pair<std::size_t, std::size_t> largest_composition(const std::vector<CompositionRow>& rows) {
  std::pair<std::size_t, std::size_t> best{0, 0};
  for (std::size_t r = 0; r < rows.size(); ++r)
    for (std::size_t k = 0; k < 3; ++k)
      if (rows[r].scores[k] > rows[best.first].scores[best.second]) best = {r, k};
  return best;
}

std::string composition_legend(const nn::TransformerConfig& c) {
  return fmt::format(
      "Composition (Elhage et al. 2021): how much an earlier head's output, its OV circuit, feeds a later head's "
      "queries (Q), keys (K) or values (V): ‖W_OV W_B‖ / (‖W_OV‖ ‖W_B‖), with W_B the later head's QK circuit, its "
      "transpose or its OV circuit (LayerNorms left out). Heads in unrelated directions give about 1/√d_model = {:.3f}.",
      1 / std::sqrt(double(c.d_model)));
}

// What the head detectors' table shows; "" when they read no sequence.
std::string detection_legend(const Inspection& in) {
  if (in.detection_sequences == 0) return "";
  return fmt::format("Head detectors (TransformerLens's), on {}: the share of each head's attention on the previous token, "
                     "on earlier copies of the query's token (duplicate), and on the token after an earlier copy "
                     "(induction).",
                     in.detection_held_out ? fmt::format("{} held-out sequences", in.detection_sequences) : "the input");
}

std::string number_text(const std::optional<double>& v) { return v ? fmt::format("{:.3f}", *v) : "-"; }

}  // namespace

nlohmann::json to_json(const Inspection& in) {
  const nn::TransformerConfig& c = in.config;
  nlohmann::json layers = nlohmann::json::array(), attention = nlohmann::json::array(),
                 scores = nlohmann::json::array(), asymmetry = nlohmann::json::array(),
                 target_weights = nlohmann::json::array();
  for (const auto& heads : in.layers) {
    nlohmann::json hs = nlohmann::json::array(), att = nlohmann::json::array(), sc = nlohmann::json::array(),
                   as = nlohmann::json::array(), op = nlohmann::json::array();
    for (const HeadInspection& h : heads) {
      nlohmann::json matrices = nlohmann::json::object();
      for (std::size_t m = 0; m < 4; ++m) matrices[matrix_names[m]] = {{"shape", h.shapes[m]}, {"norm", h.norms[m]}};
      hs.push_back({{"layer", h.layer},
                    {"head", h.head},
                    {"matrices", matrices},
                    {"sigma", h.sigma},
                    {"antisymmetry", h.antisymmetry},
                    {"singular_values", h.qk_spectrum.singular_values},
                    {"stable_rank", h.qk_spectrum.stable_rank},
                    {"rank", h.qk_spectrum.rank},
                    {"eigenvalues", eigen_json(h.qk_spectrum.eigenvalues)},
                    {"qk_circuit", matrix_json(h.qk)},
                    {"ov", {{"singular_values", h.ov_spectrum.singular_values},
                            {"stable_rank", h.ov_spectrum.stable_rank},
                            {"rank", h.ov_spectrum.rank},
                            {"eigenvalues", eigen_json(h.ov_spectrum.eigenvalues)}}},
                    {"token_qk", {{"tokens", in.vocabulary}, {"scores", matrix_json(h.token_qk)}}},
                    {"position_qk", {{"positions", h.position_qk.shape()[0]}, {"scores", matrix_json(h.position_qk)}}}});
      if (in.detection_sequences)
        hs.back()["detectors"] = {{"previous_token", h.detection.previous_token},
                                  {"duplicate_token", h.detection.duplicate_token},
                                  {"induction", h.detection.induction}};
      att.push_back(matrix_json(h.attention));
      sc.push_back(matrix_json(h.scores));
      as.push_back(h.score_asymmetry ? nlohmann::json(*h.score_asymmetry) : nlohmann::json(nullptr));
      op.push_back(h.target_attention ? nlohmann::json(*h.target_attention) : nlohmann::json(nullptr));
    }
    layers.push_back({{"heads", hs}});
    attention.push_back(att);
    scores.push_back(sc);
    asymmetry.push_back(as);
    target_weights.push_back(op);
  }
  nlohmann::json input = {{"tokens", in.input_names},
                          {"ids", in.input},
                          {"attention", attention},
                          {"scores", scores},
                          {"score_asymmetry", asymmetry}};
  if (!in.target_name.empty()) input[in.target_name + "_attention"] = target_weights;
  nlohmann::json composition = nlohmann::json::array();
  for (const HeadComposition& x : in.composition)
    composition.push_back({{"from", head_label(x.from_layer, x.from_head)}, {"to", head_label(x.to_layer, x.to_head)},
                           {"from_layer", x.from_layer}, {"from_head", x.from_head}, {"to_layer", x.to_layer},
                           {"to_head", x.to_head}, {"q", x.q}, {"k", x.k}, {"v", x.v}});
  return {{"task", in.task},
          {"dir", in.dir},
          {"config", {{"layers", c.layers}, {"heads", in.layers.empty() ? 0 : in.layers[0].size()},
                      {"d_model", c.d_model}, {"d_head", in.layers.empty() ? 0 : in.layers[0][0].shapes[0][1]},
                      {"causal", layer_masks(c)}, {"qk", nn::name_of(c.qk)},
                      {"proj", nn::name_of(c.proj)}}},
          {"layers", layers},
          {"input", input},
          {"composition", composition},
          {"detection_sequences", in.detection_sequences},
          {"detection_held_out", in.detection_held_out}};
}

void print_report(std::ostream& out, const Inspection& in, bool color) {
  const nn::TransformerConfig& c = in.config;
  const std::size_t d_head = in.layers[0][0].shapes[0][1];
  const auto bold = [&](const std::string& s) { return color ? "\x1b[1m" + s + "\x1b[0m" : s; };
  out << bold(fmt::format("qkv inspect {}: {}, {} layer{} × {} head{}, d_model {}, d_head {}, {}{}{}", in.dir, in.task,
                          c.layers, c.layers == 1 ? "" : "s", c.heads, c.heads == 1 ? "" : "s", c.d_model, d_head,
                          masks_text(c), c.qk == nn::QK::tied ? ", W_k = W_q" : c.qk == nn::QK::symmetric ? ", W_k = W_q diag(s)" : "",
                          projection_text(c.proj)))
      << "\n";
  std::string text;
  for (std::size_t i = 0; i < in.input_names.size(); ++i) text += (i ? " " : "") + in.input_names[i];
  out << "input: " << text << "\n\n";

  out << "layer head   σ      ‖A−Aᵀ‖/‖A‖  stable rank  rank  score asymmetry"
      << (in.target_name.empty() ? "" : "  weight on " + in.target_name) << "\n";
  for (const auto& heads : in.layers)
    for (const HeadInspection& h : heads)
      out << fmt::format("{:>5} {:>4}   {:.3f}  {:>10.3f}  {:>11.2f}  {:>4}  {:>15}{}\n", h.layer, h.head, h.sigma,
                         h.antisymmetry, h.qk_spectrum.stable_rank, h.qk_spectrum.rank, number_text(h.score_asymmetry),
                         in.target_name.empty() ? "" : fmt::format("  {:>17}", number_text(h.target_attention)));
  out << "σ = ‖(A+Aᵀ)/2‖² / ‖A‖² is 1 for a symmetric A (tied, symmetric or identity), about 0.5 + 1/(2·d_model) = "
      << fmt::format("{:.3f}", 0.5 + 0.5 / double(c.d_model))
      << " for a random untied one.\nScore asymmetry: the part of S−Sᵀ, on the input's pre-softmax scores S, that "
         "no per-query constant (which softmax ignores) cancels, relative to ‖S‖, over the pairs that see each other "
         "both ways; '-' under a causal mask, where none do.\n";

  const std::vector<CompositionRow> rows = composition_rows(in);
  if (!rows.empty()) {
    const auto [best_row, best_kind] = largest_composition(rows);
    out << "\n" << composition_legend(c) << "\nfrom  to        Q      K      V\n";
    for (std::size_t r = 0; r < rows.size(); ++r)
      out << fmt::format("{:<5} {:<5}  {:.3f}  {:.3f}  {:.3f}{}\n", rows[r].from, rows[r].to, rows[r].scores[0],
                         rows[r].scores[1], rows[r].scores[2],
                         r == best_row ? fmt::format("  ← the largest: {}", composition_kinds[best_kind]) : "");
  }
  if (in.detection_sequences) {
    out << "\n" << detection_legend(in) << "\nhead   previous  duplicate  induction\n";
    for (const auto& heads : in.layers)
      for (const HeadInspection& h : heads)
        out << fmt::format("{:<5}  {:>8.3f}  {:>9.3f}  {:>9.3f}\n", head_label(h.layer, h.head), h.detection.previous_token,
                           h.detection.duplicate_token, h.detection.induction);
  }

  for (const auto& heads : in.layers)
    for (const HeadInspection& h : heads) {
      out << "\n" << bold(head_name(h)) << "\n";
      std::string mats;
      for (std::size_t m = 0; m < 4; ++m)
        mats += fmt::format("{}{} {} ‖·‖ {:.3g}", m ? "   " : "  ", matrix_names[m], shape_text(h.shapes[m]), h.norms[m]);
      out << mats << "\n";
      const std::size_t n = h.qk.shape()[0];
      out << fmt::format("  QK circuit A = W_q W_kᵀ ({}×{}): σ {:.3f}, antisymmetry {:.3f}, stable rank {:.2f}, rank {} "
                         "(≤ d_head {})\n",
                         n, n, h.sigma, h.antisymmetry, h.qk_spectrum.stable_rank, h.qk_spectrum.rank, d_head);
      out << "    singular values  " << values_text(h.qk_spectrum.singular_values, h.qk_spectrum.rank) << "\n";
      out << "    eigenvalues      " << eigen_text(significant(h.qk_spectrum.eigenvalues)) << "\n";
      out << fmt::format("  OV circuit W_v W_o: stable rank {:.2f}, rank {}, singular values {}\n",
                         h.ov_spectrum.stable_rank, h.ov_spectrum.rank,
                         values_text(h.ov_spectrum.singular_values, h.ov_spectrum.rank));
      out << fmt::format("  on the input: score asymmetry {}", number_text(h.score_asymmetry));
      if (h.target_attention)
        out << fmt::format(", scored queries put {:.3f} of their weight on their {}", *h.target_attention, in.target_name);
      out << "\n\n";
      for (const auto& [name, map] : pictures(in, h)) {
        if (name == "qk-circuit") continue;  // the spectrum above says more than d_model² shades
        out << heatmap_text(map, color) << "\n";
      }
    }
}

namespace {

// The snapshots the page shows the attention of: the first, the last, and, when held-out accuracy
// rose, the last one before it passed halfway and the first one after; else two between.
std::vector<std::size_t> snapshots_to_show(const TrainingHistory& history) {
  const auto& s = history.snapshots;
  if (s.empty()) return {};
  const std::size_t last = s.size() - 1;
  std::vector<std::size_t> picks = {0, last / 3, 2 * last / 3, last};
  if (s[last].accuracy > s[0].accuracy) {
    const double half = (s[0].accuracy + s[last].accuracy) / 2;
    std::size_t j = 1;
    while (j < last && s[j].accuracy < half) ++j;
    picks = {0, j - 1, j, last};
  }
  std::sort(picks.begin(), picks.end());
  picks.erase(std::unique(picks.begin(), picks.end()), picks.end());
  return picks;
}

// A panel of more lines than a reader can tell apart names the `max_named_lines` that stand out
// and gathers the rest into one grey line through their mean, in a band from the lowest to the
// highest, drawn beneath the others: by their value at the last snapshot (composition: the
// strongest pairs at the end), or by how far they moved from the first snapshot to the last (heads).
constexpr std::size_t max_named_lines = 8;
void gather_the_rest(std::vector<ChartLine>& lines, const std::string& panel, bool by_last_value, const char* what) {
  std::vector<std::size_t> in_panel;
  for (std::size_t i = 0; i < lines.size(); ++i)
    if (lines[i].panel == panel) in_panel.push_back(i);
  if (in_panel.size() <= max_named_lines + 2) return;  // gathering two lines into one saves nothing
  std::vector<double> score(lines.size());  // of the panel's lines, each once
  for (std::size_t i : in_panel) {
    const double last = stats(lines[i].values.rbegin()->second).mean, first = stats(lines[i].values.begin()->second).mean;
    score[i] = by_last_value ? last : std::fabs(last - first);
  }
  std::vector<std::size_t> ranked = in_panel;
  std::stable_sort(ranked.begin(), ranked.end(), [&](std::size_t a, std::size_t b) { return score[a] > score[b]; });
  const std::vector<std::size_t> rest(ranked.begin() + max_named_lines, ranked.end());
  ChartLine others{.panel = panel, .series = fmt::format("the other {} {}", rest.size(), what), .many = true};
  std::vector<bool> gathered(lines.size(), false);
  for (std::size_t i : rest) {
    gathered[i] = true;
    for (const auto& [step, values] : lines[i].values) {
      auto& into = others.values[step];
      into.insert(into.end(), values.begin(), values.end());
    }
  }
  std::vector<ChartLine> kept;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (i == in_panel.front()) kept.push_back(std::move(others));
    if (!gathered[i]) kept.push_back(std::move(lines[i]));
  }
  lines = std::move(kept);
}

}  // namespace

std::vector<std::pair<std::string, std::string>> training_charts(const TrainingHistory& h) {
  if (h.logged.empty() && h.snapshots.empty()) return {};
  std::vector<ChartLine> run;
  ChartLine loss{.panel = "loss", .series = "training batches"}, accuracy{.panel = "accuracy", .series = "training batches"};
  for (const TrainingHistory::Logged& l : h.logged) {
    if (std::isfinite(l.loss)) loss.values[l.step].push_back(l.loss);
    if (std::isfinite(l.accuracy)) accuracy.values[l.step].push_back(l.accuracy);
  }
  ChartLine held_out{.panel = "accuracy", .series = "held out (snapshots)"};
  for (const auto& snap : h.snapshots)
    if (std::isfinite(snap.accuracy)) held_out.values[snap.step].push_back(snap.accuracy);
  for (ChartLine* line : {&loss, &accuracy, &held_out})
    if (!line->values.empty()) run.push_back(std::move(*line));
  std::vector<std::pair<std::string, std::string>> charts = {
      {"training", steps_chart("loss and accuracy", "the training batches (metrics.jsonl); held out: snapshots", run, false)}};
  if (h.snapshots.empty()) return charts;
  std::vector<ChartLine> heads;
  const auto add = [&](const std::string& panel, const std::string& series, std::size_t step, double v) {
    if (!std::isfinite(v)) return;
    auto it = std::find_if(heads.begin(), heads.end(), [&](const ChartLine& l) { return l.panel == panel && l.series == series; });
    if (it == heads.end()) it = heads.insert(heads.end(), ChartLine{.panel = panel, .series = series});
    it->values[step].push_back(v);
  };
  for (const auto& snap : h.snapshots) {
    for (std::size_t l = 0; l < snap.sigma.size(); ++l)
      for (std::size_t k = 0; k < snap.sigma[l].size(); ++k) {
        add("σ of the QK circuit", head_label(l, k), snap.step, snap.sigma[l][k]);
        if (snap.score_asymmetry[l][k]) add("score asymmetry on the input", head_label(l, k), snap.step, *snap.score_asymmetry[l][k]);
      }
    for (const HeadComposition& c : snap.composition) {
      const std::string pair = head_label(c.from_layer, c.from_head) + "→" + head_label(c.to_layer, c.to_head);
      add("composition", pair + " Q", snap.step, c.q);
      add("composition", pair + " K", snap.step, c.k);
      add("composition", pair + " V", snap.step, c.v);
    }
    for (const auto& [key, value] : snap.probes) add("probes", key, snap.step, value);
  }
  gather_the_rest(heads, "σ of the QK circuit", false, "heads");
  gather_the_rest(heads, "score asymmetry on the input", false, "heads");
  gather_the_rest(heads, "composition", true, "scores");
  charts.emplace_back("training-heads", steps_chart("the heads along training", "snapshots.jsonl", heads, false));
  return charts;
}

std::string training_html(const TrainingHistory& h) {
  const auto charts = training_charts(h);
  if (charts.empty()) return "";
  std::string s = "<h2>Training</h2>\n<p class=\"legend\">Loss and accuracy: means over each logging window of the "
                  "training batches (metrics.jsonl)";
  if (!h.snapshots.empty())
    s += ", and held out, on the final evaluation's sequences, at each snapshot. The heads: σ = ‖(A+Aᵀ)/2‖²/‖A‖² of each "
         "head, its softmax-invariant score asymmetry on the input (bidirectional layers), the composition between layers "
         "and the task's probes, at each snapshot (snapshots.jsonl); a panel of more than " +
         std::to_string(max_named_lines + 2) + " lines names the " + std::to_string(max_named_lines) +
         " that stand out (heads: those that moved most; composition: the strongest at the last snapshot) and draws "
         "the others as one grey line, their mean, in a band from the lowest to the highest. Each head's attention at "
         "a few snapshots is with its pictures, below";
  s += ".</p>\n<div class=\"pics\">\n";
  for (const auto& [name, svg] : charts) s += svg;
  return s + "</div>\n";
}

namespace {

// A head's attention on the snapshots' input at the snapshots the page shows, by file name
// ("L0H0-step-400").
std::vector<std::pair<std::string, Heatmap>> steps_pictures(const Inspection& in, std::size_t layer, std::size_t head) {
  std::vector<std::pair<std::string, Heatmap>> out;
  for (std::size_t p : snapshots_to_show(in.history)) {
    const auto& snap = in.history.snapshots[p];
    std::vector<std::string> names;
    for (std::int64_t t : snap.input)
      names.push_back(t >= 0 && std::size_t(t) < in.vocabulary.size() ? in.vocabulary[std::size_t(t)] : "?");
    out.emplace_back(fmt::format("{}-step-{}", head_label(layer, head), snap.step),
                     attention_map(snap.attention[layer][head], names, fmt::format("{} at step {}", head_label(layer, head), snap.step)));
  }
  return out;
}

// The page's script: the pictures of one head at a time, the one the address names ("#L1H0") or
// the first, chosen by the links above them; each drawn when first shown.
constexpr const char* head_picker_script = R"(function showHead(id) {
  const heads = [...document.querySelectorAll('section.head')];
  const shown = heads.find(h => h.id === id) || heads[0];
  for (const h of heads) h.hidden = h !== shown;
  for (const a of document.querySelectorAll('nav.heads a')) a.classList.toggle('shown', a.hash === '#' + shown.id);
  showPictures(shown);
}
for (const a of document.querySelectorAll('nav.heads a'))
  a.addEventListener('click', event => {
    event.preventDefault();
    history.replaceState(null, '', a.hash);
    showHead(a.hash.slice(1));
  });
window.addEventListener('hashchange', () => showHead(location.hash.slice(1)));
showHead(location.hash.slice(1));
)";

}  // namespace

std::string to_html(const Inspection& in) {
  const nn::TransformerConfig& c = in.config;
  std::string text;
  for (std::size_t i = 0; i < in.input_names.size(); ++i) text += (i ? " " : "") + in.input_names[i];
  std::string s = page_start("qkv inspect" + (in.dir.empty() ? "" : " " + in.dir));
  s += fmt::format("<h1>qkv inspect: {} ({} layer{} × {} head{}, d_model {}, {})</h1>\n", escape_xml(in.task), c.layers,
                   c.layers == 1 ? "" : "s", c.heads, c.heads == 1 ? "" : "s", c.d_model,
                   masks_text(c));
  s += fmt::format("<p>Input: <code>{}</code></p>\n", escape_xml(text));
  s += R"(<div class="legend"><p><b>How to read it.</b>
<b>Attention</b>: row i is query position i, column j key position j; darker means more weight; grey cells are masked.
<b>Token QK</b>: the score a query token (row) gives a key token (column) through this head, with only the token's
embedding in the stream (after the layer's LayerNorm; positions left out). Red: the query looks for that key; blue: it
avoids it. An asymmetric table (row a, column b differs from row b, column a) is a relation with a direction, which a
tied W_q = W_k cannot express. <b>Position QK</b>: the same with only a position's embedding.
<b>QK circuit</b>: A = W_q W_kᵀ in the residual basis, the matrix whose bilinear form is the score.</p>
<p><b>σ</b> = ‖(A+Aᵀ)/2‖²/‖A‖² is the symmetric share of A: exactly 1 for tied, symmetric or identity projections, and already
about 0.5 + 1/(2·d_model) for a random untied head, so σ alone does not show what was learned; the tables and the
attention pattern do. <b>Score asymmetry</b> is the part of S−Sᵀ, on the input's pre-softmax scores S, that no
per-query constant (which softmax ignores) cancels, relative to ‖S‖, over the pairs that see each other both ways;
'-' under a causal mask, where none do. Hover over a cell for its value. In a causal model the position table greys out the keys after the query,
which the mask hides.</p></div>
)";
  s += "<table><tr><th>layer</th><th>head</th><th>σ</th><th>‖A−Aᵀ‖/‖A‖</th><th>stable rank</th><th>rank</th>"
       "<th>score asymmetry</th>";
  if (!in.target_name.empty()) s += fmt::format("<th>weight on {}</th>", escape_xml(in.target_name));
  s += "</tr>\n";
  for (const auto& heads : in.layers)
    for (const HeadInspection& h : heads) {
      s += fmt::format("<tr><td>{}</td><td>{}</td><td>{:.3f}</td><td>{:.3f}</td><td>{:.2f}</td><td>{}</td><td>{}</td>",
                       h.layer, h.head, h.sigma, h.antisymmetry, h.qk_spectrum.stable_rank, h.qk_spectrum.rank,
                       number_text(h.score_asymmetry));
      if (!in.target_name.empty()) s += fmt::format("<td>{}</td>", number_text(h.target_attention));
      s += "</tr>\n";
    }
  s += "</table>\n";
  const std::vector<CompositionRow> rows = composition_rows(in);
  if (!rows.empty()) {
    const auto [best_row, best_kind] = largest_composition(rows);
    s += fmt::format("<h2>Composition</h2>\n<p class=\"legend\">{} The largest is in bold.</p>\n",
                     escape_xml(composition_legend(c)));
    s += "<table><tr><th>from</th><th>to</th><th>Q</th><th>K</th><th>V</th></tr>\n";
    for (std::size_t r = 0; r < rows.size(); ++r) {
      s += fmt::format("<tr><td>{}</td><td>{}</td>", rows[r].from, rows[r].to);
      for (std::size_t k = 0; k < 3; ++k)
        s += r == best_row && k == best_kind ? fmt::format("<td><b>{:.3f}</b></td>", rows[r].scores[k])
                                             : fmt::format("<td>{:.3f}</td>", rows[r].scores[k]);
      s += "</tr>\n";
    }
    s += "</table>\n";
  }
  if (in.detection_sequences) {
    s += fmt::format("<h2>Head detectors</h2>\n<p class=\"legend\">{}</p>\n", escape_xml(detection_legend(in)));
    s += "<table><tr><th>head</th><th>previous</th><th>duplicate</th><th>induction</th></tr>\n";
    for (const auto& heads : in.layers)
      for (const HeadInspection& h : heads)
        s += fmt::format("<tr><td>{}</td><td>{:.3f}</td><td>{:.3f}</td><td>{:.3f}</td></tr>\n", head_label(h.layer, h.head),
                         h.detection.previous_token, h.detection.duplicate_token, h.detection.induction);
    s += "</table>\n";
  }
  s += training_html(in.history);
  if (!in.history.logged.empty() && in.history.snapshots.empty())
    s += "<p>No snapshots: <code>qkv train --snapshot-every N</code> keeps the heads along training.</p>\n";
  s += explore_html(in);
  // One head's pictures at a time, each head's data packed into the page; the script draws them.
  s += "<h2>The heads</h2>\n<nav class=\"heads\">";
  for (const auto& heads : in.layers) {
    s += fmt::format("<span>layer {}:", heads.at(0).layer);
    for (const HeadInspection& h : heads) s += fmt::format(" <a href=\"#{0}\">{0}</a>", head_label(h.layer, h.head));
    s += "</span> ";
  }
  s += "</nav>\n<noscript><p>The pictures are drawn by the page's script; <code>qkv inspect --svg DIR</code> writes them "
       "as files.</p></noscript>\n";
  const std::vector<std::size_t> picks = snapshots_to_show(in.history);
  PicturePack pack;
  for (const auto& heads : in.layers)
    for (const HeadInspection& h : heads) {
      s += fmt::format("<section class=\"head\" id=\"{}\"{}>\n<h2>{}</h2>\n<p>", head_label(h.layer, h.head),
                       h.layer + h.head == 0 ? "" : " hidden", head_name(h));
      for (std::size_t m = 0; m < 4; ++m)
        s += fmt::format("{}{} {} (‖·‖ {:.3g})", m ? ", " : "", matrix_names[m], shape_text(h.shapes[m]), h.norms[m]);
      s += fmt::format(".<br>QK circuit: σ {:.3f}, antisymmetry {:.3f}, stable rank {:.2f}, rank {}; singular values {}; "
                       "eigenvalues {}.<br>OV circuit: stable rank {:.2f}, rank {}, singular values {}.<br>"
                       "On the input: score asymmetry {}",
                       h.sigma, h.antisymmetry, h.qk_spectrum.stable_rank, h.qk_spectrum.rank,
                       values_text(h.qk_spectrum.singular_values, h.qk_spectrum.rank),
                       eigen_text(significant(h.qk_spectrum.eigenvalues)), h.ov_spectrum.stable_rank,
                       h.ov_spectrum.rank, values_text(h.ov_spectrum.singular_values, h.ov_spectrum.rank),
                       number_text(h.score_asymmetry));
      if (h.target_attention)
        s += fmt::format("; scored queries put {:.3f} of their weight on their {}", *h.target_attention,
                         escape_xml(in.target_name));
      s += ".</p>\n<div class=\"pics\">\n";
      for (const auto& [name, map] : pictures(in, h)) s += pack.add(heatmap_svg(map, Cells::packed));
      s += "</div>\n";
      if (!picks.empty()) {
        s += "<p>Attention on the input at steps ";
        for (std::size_t i = 0; i < picks.size(); ++i)
          s += fmt::format("{}{} (held-out accuracy {:.1f}%)", i ? ", " : "", in.history.snapshots[picks[i]].step,
                           100 * in.history.snapshots[picks[i]].accuracy);
        s += ".</p>\n<div class=\"pics\">\n";
        for (const auto& [name, map] : steps_pictures(in, h.layer, h.head)) s += pack.add(heatmap_svg(map, Cells::packed));
        s += "</div>\n";
      }
      s += "</section>\n";
    }
  s += pack.lines_script() + "<script>\n" + heatmap_script() + head_picker_script + explore_script() +
       "</script>\n</body></html>\n";
  return s;
}

std::vector<std::string> write_svgs(const Inspection& in, const std::string& dir) {
  std::vector<std::pair<std::string, std::string>> svgs;
  for (const auto& heads : in.layers)
    for (const HeadInspection& h : heads) {
      for (const auto& [name, map] : pictures(in, h)) svgs.emplace_back(head_label(h.layer, h.head) + "-" + name, heatmap_svg(map));
      for (const auto& [name, map] : steps_pictures(in, h.layer, h.head)) svgs.emplace_back(name, heatmap_svg(map));
    }
  for (auto& chart : training_charts(in.history)) svgs.push_back(std::move(chart));
  return write_svg_files(dir, svgs);
}

}  // namespace qkv::report
