#include "qkv/report/ablate.hpp"

#include <ostream>

#include <fmt/format.h>

#include "qkv/report/heatmap.hpp"
#include <fmt/ostream.h>

namespace qkv::report {

using namespace tasks;

using namespace analysis;

namespace {

std::string head_name(const HeadAblation& h) { return head_label(h.layer, h.head); }

nlohmann::json score_json(const AblationScore& s) { return {{"accuracy", s.accuracy}, {"loss", s.loss}}; }

template <class T, class F>
nlohmann::json optional_json(const std::optional<T>& v, F&& to) {
  return v ? nlohmann::json(to(*v)) : nlohmann::json();
}

std::vector<std::string> needed_heads(const Ablation& a) {
  std::vector<std::string> names;
  for (const HeadAblation& h : a.heads)
    if (h.needed) names.push_back(head_name(h));
  return names;
}

}  // namespace

nlohmann::json to_json(const Ablation& a) {
  nlohmann::json heads = nlohmann::json::array();
  const auto share = [](double v) { return v; };
  for (const HeadAblation& h : a.heads) {
    nlohmann::json j = {{"layer", h.layer}, {"head", h.head}, {"name", head_name(h)}, {"read", h.read}};
    if (h.read)
      j.update({{"zero", score_json(h.zero)}, {"mean", score_json(h.mean)}, {"noised", optional_json(h.noised, score_json)},
                {"denoised", optional_json(h.denoised, score_json)}, {"noising_share", optional_json(h.noising_share, share)},
                {"denoising_share", optional_json(h.denoising_share, share)}, {"needed", h.needed}});
    heads.push_back(std::move(j));
  }
  return {{"task", a.task},
          {"dir", a.dir},
          {"sequences", a.sequences},
          {"seed", a.data.empty() ? nlohmann::json(a.seed) : nlohmann::json()},
          {"data", a.data.empty() ? nlohmann::json() : nlohmann::json(a.data)},
          {"clean", score_json(a.clean)},
          {"corruption", a.corruption.empty() ? nlohmann::json() : nlohmann::json(a.corruption)},
          {"corrupted", optional_json(a.corrupted, score_json)},
          {"heads", heads},
          {"needed", needed_heads(a)}};
}

void print_ablation(std::ostream& out, const Ablation& a) {
  const auto pct = [](double v) { return fmt::format("{:.1f}%", 100 * v); };
  const auto opt_pct = [&](const std::optional<double>& v) { return v ? pct(*v) : std::string("-"); };
  const std::string& name = a.dir.empty() ? a.task : a.dir;
  if (a.data.empty()) fmt::print(out, "{}: {} held-out sequences of {} (seed {})\n", name, a.sequences, a.task, a.seed);
  else fmt::print(out, "{}: the {} sequences of {}\n", name, a.sequences, a.data);
  fmt::print(out, "clean:      accuracy {:>6}  loss {:.4f}\n", pct(a.clean.accuracy), a.clean.loss);
  if (a.corrupted)
    fmt::print(out, "corrupted:  accuracy {:>6}  loss {:.4f}  ({}; scored on the clean answers)\n",
               pct(a.corrupted->accuracy), a.corrupted->loss, a.corruption);
  fmt::print(out, "\n{:<6}{:^17}{:^17}", "", "zero-ablated", "mean-ablated");
  if (a.corrupted) fmt::print(out, "{:^26}{:^26}", "noised: from corrupted", "denoised: from clean");
  fmt::print(out, "\n{:<6}{:>9}{:>8}{:>9}{:>8}", "head", "accuracy", "loss", "accuracy", "loss");
  if (a.corrupted) fmt::print(out, "{:>9}{:>8}{:>9}{:>9}{:>8}{:>9}", "accuracy", "loss", "of gap", "accuracy", "loss", "of gap");
  fmt::print(out, "\n");
  bool unread = false;
  for (const HeadAblation& h : a.heads) {
    if (!h.read) {
      fmt::print(out, "{:<6}  not read: the readout is this layer's head-0 scores\n", head_name(h));
      unread = true;
      continue;
    }
    fmt::print(out, "{:<6}{:>9}{:>8.4f}{:>9}{:>8.4f}", head_name(h), pct(h.zero.accuracy), h.zero.loss, pct(h.mean.accuracy),
               h.mean.loss);
    if (h.noised)
      fmt::print(out, "{:>9}{:>8.4f}{:>9}{:>9}{:>8.4f}{:>9}", pct(h.noised->accuracy), h.noised->loss, opt_pct(h.noising_share),
                 pct(h.denoised->accuracy), h.denoised->loss, opt_pct(h.denoising_share));
    fmt::print(out, "{}\n", h.needed ? "  needed" : "");
  }
  const auto needed = needed_heads(a);
  fmt::print(out, "\n{}: zero- and mean-ablated, accuracy below half the clean accuracy.\n",
             needed.empty() ? "No head is needed alone" : fmt::format("The task needs {}", fmt::join(needed, ", ")));
  if (unread)
    fmt::print(out, "A pointer model's answer is its last layer's head-0 scores, made before that layer's heads output "
                    "anything: ablating them changes nothing.\n");
  if (a.corrupted)
    fmt::print(out, "Noised: the clean run with the head's output from the corrupted input, \"of gap\" the share of the "
                    "corrupted input's extra loss it brings; denoised: the corrupted run with the head's output from the "
                    "clean input, \"of gap\" the share of that loss it takes back.\n");
}

}  // namespace qkv::report
