#include "qkv/report/logit_attribution.hpp"

#include <cmath>
#include <ostream>

#include <fmt/format.h>

#include "qkv/report/heatmap.hpp"
#include <fmt/ostream.h>

namespace qkv::report {

using analysis::LogitAttribution;

nlohmann::json to_json(const LogitAttribution& a, const std::string& dir) {
  nlohmann::json layers = nlohmann::json::array();
  for (std::size_t l = 0; l < a.heads.size(); ++l) {
    nlohmann::json heads = nlohmann::json::array();
    for (std::size_t h = 0; h < a.heads[l].size(); ++h) heads.push_back({{"head", h}, {"logit_diff", a.heads[l][h]}});
    layers.push_back({{"layer", l},
                      {"attention", a.attention(l)},
                      {"attn_bias", a.attn_bias[l]},
                      {"mlp", a.mlp.empty() ? nlohmann::json() : nlohmann::json(a.mlp[l])},
                      {"heads", std::move(heads)}});
  }
  return {{"task", a.task},     {"dir", dir},           {"sequences", a.sequences},
          {"positions", a.positions}, {"seed", a.seed}, {"logit_diff", a.logit_diff},
          {"embed", a.embed},   {"pos_embed", a.pos_embed}, {"bias", a.bias},
          {"layers", std::move(layers)}, {"total", a.total()}};
}

void print_logit_attribution(std::ostream& out, const LogitAttribution& a, const std::string& dir) {
  fmt::print(out, "{}: {} held-out sequences of {} (seed {}), {} scored positions\n", dir.empty() ? a.task : dir, a.sequences,
             a.task, a.seed, a.positions);
  fmt::print(out,
             "direct logit attribution: each part of the final residual stream's share of the logit difference (the "
             "target's logit minus the best other one, mean {:+.3f}), through ln_final with its scale held at the run's\n\n",
             a.logit_diff);
  const auto row = [&](const std::string& name, double v) {
    fmt::print(out, "{:<22}{:>+10.3f}{:>9.1f}%\n", name, v, a.logit_diff != 0 ? 100 * v / a.logit_diff : NAN);
  };
  fmt::print(out, "{:<22}{:>10}{:>10}\n", "part", "logit diff", "share");
  row("token embedding", a.embed);
  row("position embedding", a.pos_embed);
  for (std::size_t l = 0; l < a.heads.size(); ++l) {
    for (std::size_t h = 0; h < a.heads[l].size(); ++h) row(head_label(l, h), a.heads[l][h]);
    row(fmt::format("L{} attention bias", l), a.attn_bias[l]);
    row(fmt::format("L{} attention", l), a.attention(l));
    if (!a.mlp.empty()) row(fmt::format("L{} MLP", l), a.mlp[l]);
  }
  row("readout biases", a.bias);
  row("total", a.total());
}

}  // namespace qkv::report
