#include "qkv/report/patching.hpp"

#include <algorithm>
#include <cmath>
#include <ostream>

#include <fmt/format.h>
#include <fmt/ostream.h>

namespace qkv::report {

using analysis::PatchScore;

namespace {



bool residual(const Patching& p) { return !analysis::per_head(analysis::patch_component(p.component)); }
bool noising(const Patching& p) { return p.direction == "noising"; }

std::string row_name(const Patching& p, std::size_t l, std::size_t h) {
  return residual(p) ? fmt::format("L{}", l) : head_label(l, h);
}

std::string what_share(const Patching& p) {
  return noising(p) ? "share of the corrupted input's extra loss each patch brings into the clean run"
                    : "share of the clean run's lower loss each patch restores in the corrupted run";
}

// Where each patch is, in words: "L1H0", "L1H0 at 13 (12)", "L1H0 query 13 (12) → key 2 (25)".
std::string where(const Patching& p, std::size_t l, std::size_t h, std::size_t position) {
  const std::string row = row_name(p, l, h);
  if (!p.by_position) return row;
  if (p.component == "pattern") {
    const std::size_t q = position / p.length, k = position % p.length;
    return fmt::format("{} query {} ({}) → key {} ({})", row, q, p.positions[q], k, p.positions[k]);
  }
  return fmt::format("{} at {} ({})", row, position, p.positions[position]);
}

}  // namespace

nlohmann::json finite_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

nlohmann::json to_json(const PatchScore& s) {
  return {{"accuracy", finite_or_null(s.accuracy)}, {"loss", s.loss}, {"logit_diff", finite_or_null(s.logit_diff)}};
}

std::string percent(double v) { return std::isfinite(v) ? fmt::format("{:.1f}%", 100 * v) : std::string("-"); }

nlohmann::json to_json(const Patching& p) {
  nlohmann::json layers = nlohmann::json::array();
  for (std::size_t l = 0; l < p.patched.size(); ++l) {
    nlohmann::json heads = nlohmann::json::array();
    for (std::size_t h = 0; h < p.patched[l].size(); ++h) {
      nlohmann::json patched = nlohmann::json::array();
      for (const PatchScore& s : p.patched[l][h]) {
        nlohmann::json j = to_json(s);
        j["loss_share"] = finite_or_null(Patching::share(s.loss, p.clean.loss, p.corrupted.loss, noising(p)));
        j["logit_diff_share"] = finite_or_null(Patching::share(s.logit_diff, p.clean.logit_diff, p.corrupted.logit_diff, noising(p)));
        patched.push_back(std::move(j));
      }
      heads.push_back({{"head", h}, {"patched", std::move(patched)}});
    }
    layers.push_back({{"layer", l}, {"heads", std::move(heads)}});
  }
  return {{"task", p.task},
          {"dir", p.dir},
          {"corruption", p.corruption},
          {"component", p.component},
          {"direction", p.direction},
          {"sequences", p.sequences},
          {"length", p.length},
          {"seed", p.seed},
          {"by_position", p.by_position},
          {"attribution", p.attribution},
          {"positions", p.positions},
          {"clean", to_json(p.clean)},
          {"corrupted", to_json(p.corrupted)},
          {"layers", std::move(layers)}};
}

std::vector<std::pair<std::string, Heatmap>> patching_heatmaps(const Patching& p) {
  const std::size_t L = p.patched.size(), H = L ? p.patched[0].size() : 0;
  const std::string title = fmt::format("{} {}: {}", p.direction, p.component, what_share(p));
  std::vector<std::pair<std::string, Heatmap>> out;
  if (!p.by_position) {
    Heatmap map{.values = Array<double>::from_shape({L, H}), .rows = {}, .cols = {}, .title = title};
    for (std::size_t l = 0; l < L; ++l) map.rows.push_back(fmt::format("L{}", l));
    for (std::size_t h = 0; h < H; ++h) map.cols.push_back(residual(p) ? std::string("all") : fmt::format("H{}", h));
    for (std::size_t l = 0; l < L; ++l)
      for (std::size_t h = 0; h < H; ++h) map.values(l, h) = p.loss_share(l, h, 0);
    map.row_axis = "layer", map.col_axis = residual(p) ? "component" : "head";
    out.emplace_back("patch-" + p.component, std::move(map));
    return out;
  }
  if (p.component == "pattern") {
    for (std::size_t l = 0; l < L; ++l)
      for (std::size_t h = 0; h < H; ++h) {
        Heatmap map{.values = Array<double>::from_shape({p.length, p.length}), .rows = p.positions, .cols = p.positions,
                    .title = fmt::format("{} {} of {}", p.direction, p.component, row_name(p, l, h)) + ": " + what_share(p)};
        for (std::size_t q = 0; q < p.length; ++q)
          for (std::size_t k = 0; k < p.length; ++k) map.values(q, k) = p.loss_share(l, h, q * p.length + k);
        map.row_axis = "query position", map.col_axis = "key position", map.indexed = true;
        out.emplace_back(fmt::format("patch-pattern-{}", row_name(p, l, h)), std::move(map));
      }
    return out;
  }
  Heatmap map{.values = Array<double>::from_shape({L * H, p.length}), .rows = {}, .cols = {}, .title = title};
  map.cols = p.positions;
  for (std::size_t l = 0; l < L; ++l)
    for (std::size_t h = 0; h < H; ++h) {
      map.rows.push_back(row_name(p, l, h));
      for (std::size_t t = 0; t < p.length; ++t) map.values(l * H + h, t) = p.loss_share(l, h, t);
    }
  map.row_axis = residual(p) ? "layer" : "head", map.col_axis = "position (the first sequence's token)";
  out.emplace_back("patch-" + p.component, std::move(map));
  return out;
}

void print_patch_runs(std::ostream& out, const std::string& dir, const std::string& task, std::size_t sequences,
                      std::uint64_t seed, std::size_t length, const PatchScore& clean, const PatchScore& corrupted,
                      const std::string& corruption) {
  fmt::print(out, "{}: {} held-out sequences of {} (seed {}), {} tokens each\n", dir.empty() ? task : dir, sequences, task,
             seed, length);
  fmt::print(out, "clean:      accuracy {:>6}  loss {:.4f}  logit diff {:+.3f}\n", percent(clean.accuracy), clean.loss,
             clean.logit_diff);
  fmt::print(out, "corrupted:  accuracy {:>6}  loss {:.4f}  logit diff {:+.3f}  ({}; scored on the clean answers)\n",
             percent(corrupted.accuracy), corrupted.loss, corrupted.logit_diff, corruption);
}

void print_patching(std::ostream& out, const Patching& p, bool color) {
  const auto pct = percent;
  const auto share = percent;
  const auto signed_number = [](double v) { return std::isfinite(v) ? fmt::format("{:+.3f}", v) : std::string("-"); };
  print_patch_runs(out, p.dir, p.task, p.sequences, p.seed, p.length, p.clean, p.corrupted, p.corruption);
  fmt::print(out, "{}{} {}{}: the {}; logit diff is the target's logit minus the best other one.\n",
             p.attribution ? "attribution patching, " : "", p.direction, p.component,
             p.by_position ? (p.component == "pattern" ? " by (query, key)" : " by position") : "", what_share(p));
  if (p.attribution)
    fmt::print(out, "Each patch's loss is a first-order estimate from the gradient of the run it patches; accuracy and logit "
                    "diff are not estimated.\n");
  fmt::print(out, "\n");
  if (!p.by_position) {
    fmt::print(out, "{:<6}{:>9}{:>9}{:>12}{:>16}{:>21}\n", residual(p) ? "layer" : "head", "accuracy", "loss", "logit diff",
               "share of loss", "share of logit diff");
    for (std::size_t l = 0; l < p.patched.size(); ++l)
      for (std::size_t h = 0; h < p.patched[l].size(); ++h) {
        const PatchScore& s = p.patched[l][h][0];
        fmt::print(out, "{:<6}{:>9}{:>9.4f}{:>12}{:>16}{:>21}\n", row_name(p, l, h), pct(s.accuracy), s.loss, signed_number(s.logit_diff),
                   share(p.loss_share(l, h, 0)),
                   share(Patching::share(s.logit_diff, p.clean.logit_diff, p.corrupted.logit_diff, noising(p))));
      }
    return;
  }
  for (const auto& [name, map] : patching_heatmaps(p)) out << heatmap_text(map, color) << "\n";
  // The largest shares, by size.
  struct Entry {
    double share;
    std::size_t l, h, position;
  };
  std::vector<Entry> entries;
  for (std::size_t l = 0; l < p.patched.size(); ++l)
    for (std::size_t h = 0; h < p.patched[l].size(); ++h)
      for (std::size_t q = 0; q < p.patched[l][h].size(); ++q)
        if (const double s = p.loss_share(l, h, q); std::isfinite(s)) entries.push_back({s, l, h, q});
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return std::abs(a.share) > std::abs(b.share); });
  fmt::print(out, "the largest shares of loss:\n");
  for (std::size_t i = 0; i < std::min<std::size_t>(entries.size(), 8); ++i)
    fmt::print(out, "  {:>7}  {}\n", pct(entries[i].share), where(p, entries[i].l, entries[i].h, entries[i].position));
}

}  // namespace qkv::report
