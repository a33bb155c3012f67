#include "qkv/report/fourier.hpp"

#include <algorithm>
#include <numeric>
#include <ostream>

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>

#include "qkv/report/charts.hpp"
#include "qkv/report/heatmap.hpp"
#include "qkv/report/patching.hpp"

namespace qkv::report {

namespace {

nlohmann::json shares_json(const std::vector<analysis::FrequencyShare>& shares) {
  nlohmann::json out = nlohmann::json::array();
  for (const analysis::FrequencyShare& s : shares) out.push_back({{"frequency", s.frequency}, {"share", s.share}});
  return out;
}

// The share of the squared norm per frequency that the key frequencies hold.
double key_share(const std::vector<double>& norms, const std::vector<std::size_t>& keys) {
  double all = 0, key = 0;
  for (std::size_t k = 1; k < norms.size(); ++k) all += norms[k] * norms[k];
  for (std::size_t k : keys) key += norms[k] * norms[k];
  return all > 0 ? key / all : 0;
}

// The `count` frequencies of largest norm, as "14 (3.21)".
std::string largest(const std::vector<double>& norms, std::size_t count) {
  std::vector<std::size_t> order(norms.size() - 1);
  std::iota(order.begin(), order.end(), 1);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return norms[a] > norms[b]; });
  order.resize(std::min(count, order.size()));
  std::vector<std::string> parts;
  for (std::size_t k : order) parts.push_back(fmt::format("{} ({:.2f})", k, norms[k]));
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace

nlohmann::json to_json(const analysis::FourierAnalysis& a) {
  nlohmann::json heads = nlohmann::json::array();
  for (const auto& layer : a.heads) heads.push_back(shares_json(layer));
  return {{"p", a.p},
          {"key_frequencies", a.key_frequencies},
          {"found", a.found},
          {"embed", a.embed},
          {"unembed", a.unembed},
          {"embed_key_share", key_share(a.embed, a.key_frequencies)},
          {"unembed_key_share", key_share(a.unembed, a.key_frequencies)},
          {"neurons_per_frequency", a.neurons_per_frequency},
          {"neurons", shares_json(a.neurons)},
          {"heads", heads},
          {"train_loss", finite_or_null(a.train_loss)},
          {"test_loss", finite_or_null(a.test_loss)},
          {"train_accuracy", a.train_accuracy},
          {"test_accuracy", a.test_accuracy},
          {"restricted_loss", finite_or_null(a.restricted_loss)},
          {"restricted_accuracy", a.restricted_accuracy},
          {"excluded_loss", finite_or_null(a.excluded_loss)},
          {"excluded_accuracy", a.excluded_accuracy},
          {"weight_norm", a.weight_norm}};
}

nlohmann::json to_json(const analysis::FourierRun& r) {
  nlohmann::json along = nlohmann::json::array();
  for (std::size_t i = 0; i < r.steps.size(); ++i) {
    nlohmann::json row = {{"step", r.steps[i]}};
    row.update(to_json(r.along[i]));
    along.push_back(row);
  }
  return {{"dir", r.dir}, {"final", to_json(r.final)}, {"along", along}};
}

void print_fourier(std::ostream& out, const analysis::FourierRun& r) {
  const analysis::FourierAnalysis& f = r.final;
  fmt::print(out, "{}: modular addition, p = {}; the model in the Fourier basis of Z_{} (frequencies 1-{})\n\n", r.dir, f.p,
             f.p, f.p / 2);
  std::size_t explained = 0;
  for (std::size_t k = 1; k < f.neurons_per_frequency.size(); ++k) explained += f.neurons_per_frequency[k];
  if (!f.neurons.empty()) {
    fmt::print(out, "key frequencies: {} (the MLP neurons' best frequencies)\n",
               f.found.empty() ? std::string("none") : fmt::format("{}", fmt::join(f.found, ", ")));
    std::vector<std::string> counts;
    for (std::size_t k : f.found)
      if (f.neurons_per_frequency[k] > 0) counts.push_back(fmt::format("{}: {}", k, f.neurons_per_frequency[k]));
    fmt::print(out, "MLP neurons with at least 85% of their variance in one frequency: {} of {}{}\n", explained,
               f.neurons.size(), counts.empty() ? std::string() : fmt::format(" ({})", fmt::join(counts, ", ")));
  }
  fmt::print(out, "embedding, largest norms by frequency: {}; key frequencies hold {} of its norm²\n", largest(f.embed, 8),
             percent(key_share(f.embed, f.key_frequencies)));
  fmt::print(out, "unembedding, largest norms by frequency: {}; key frequencies hold {}\n", largest(f.unembed, 8),
             percent(key_share(f.unembed, f.key_frequencies)));
  for (std::size_t l = 0; l < f.heads.size(); ++l)
    for (std::size_t h = 0; h < f.heads[l].size(); ++h)
      fmt::print(out, "{} attention from = to a: frequency {} holds {} of its variance\n", head_label(l, h),
                 f.heads[l][h].frequency, percent(f.heads[l][h].share));
  fmt::print(out,
             "\nloss (accuracy): training {:.4g} ({}), held out {:.4g} ({}); restricted to the key frequencies, all pairs "
             "{:.4g} ({}); key frequencies excluded, training pairs {:.4g} ({}); weight norm² {:.1f}\n",
             f.train_loss, percent(f.train_accuracy), f.test_loss, percent(f.test_accuracy), f.restricted_loss,
             percent(f.restricted_accuracy), f.excluded_loss, percent(f.excluded_accuracy), f.weight_norm);
  if (r.steps.empty()) return;
  fmt::print(out, "\nalong training, the checkpoints kept, with the key frequencies {}:\n",
             fmt::join(f.key_frequencies, ", "));
  fmt::print(out, "{:>8}{:>12}{:>12}{:>12}{:>12}{:>12}{:>15}\n", "step", "train loss", "held out", "restricted",
             "excluded", "key norm²", "weight norm²");
  for (std::size_t i = 0; i < r.steps.size(); ++i) {
    const analysis::FourierAnalysis& a = r.along[i];
    fmt::print(out, "{:>8}{:>12.4g}{:>12.4g}{:>12.4g}{:>12.4g}{:>12}{:>15.1f}\n", r.steps[i], a.train_loss, a.test_loss,
               a.restricted_loss, a.excluded_loss, percent(key_share(a.embed, f.key_frequencies)), a.weight_norm);
  }
  fmt::print(out, "key norm²: the share of the embedding's norm² (frequencies 1-{}) in the key frequencies\n", f.p / 2);
}

std::vector<std::pair<std::string, std::string>> fourier_charts(const analysis::FourierRun& r) {
  if (r.steps.empty()) return {};
  std::vector<ChartLine> loss, progress, norm, keys;
  const auto line = [](std::vector<ChartLine>& lines, const std::string& panel, const std::string& series) -> ChartLine& {
    auto it = std::find_if(lines.begin(), lines.end(), [&](const ChartLine& l) { return l.panel == panel && l.series == series; });
    return it == lines.end() ? lines.emplace_back(ChartLine{.panel = panel, .series = series}) : *it;
  };
  for (std::size_t i = 0; i < r.steps.size(); ++i) {
    const analysis::FourierAnalysis& a = r.along[i];
    const std::size_t step = r.steps[i];
    line(loss, "", "training").values[step].push_back(a.train_loss);
    line(loss, "", "held out").values[step].push_back(a.test_loss);
    line(progress, "loss", "held out").values[step].push_back(a.test_loss);
    line(progress, "loss", "restricted (all pairs)").values[step].push_back(a.restricted_loss);
    line(progress, "loss", "excluded (training pairs)").values[step].push_back(a.excluded_loss);
    line(norm, "weight norm²", "weight norm²").values[step].push_back(a.weight_norm);
    for (std::size_t k : r.final.key_frequencies)
      line(keys, "embedding norm", fmt::format("frequency {}", k)).values[step].push_back(a.embed.at(k));
    line(keys, "key frequencies' share of the norm²", "share").values[step].push_back(key_share(a.embed, r.final.key_frequencies));
  }
  const std::string subtitle = fmt::format("{}: p = {}, the checkpoints kept; key frequencies {}", r.dir, r.final.p,
                                           r.final.key_frequencies.empty() ? std::string("none")
                                                                           : fmt::format("{}", fmt::join(r.final.key_frequencies, ", ")));
  std::vector<std::pair<std::string, std::string>> charts;
  charts.emplace_back("fourier-loss", steps_chart("training and held-out loss", subtitle, loss, true, true));
  charts.emplace_back("fourier-progress", steps_chart("progress measures: restricted and excluded loss", subtitle, progress,
                                                      true, true));
  charts.emplace_back("fourier-weight-norm", steps_chart("weight norm", subtitle, norm, false));
  if (!r.final.key_frequencies.empty())
    charts.emplace_back("fourier-key-norms", steps_chart("the key frequencies in the embedding", subtitle, keys, false));
  return charts;
}

}  // namespace qkv::report
