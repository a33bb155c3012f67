#include "qkv/report/path_patching.hpp"

#include <cmath>
#include <ostream>

#include <fmt/format.h>

#include "qkv/report/heatmap.hpp"
#include <fmt/ostream.h>

#include "qkv/report/patching.hpp"

namespace qkv::report {

using analysis::PathPatching;

namespace {

std::string sender_of(const PathPatching::Path& p) { return head_label(p.sender_layer, p.sender_head); }
std::string receiver_of(const PathPatching::Path& p) {
  return p.input == "logits" ? std::string("logits") : head_label(p.receiver_layer, p.receiver_head);
}
double logit_diff_share(const PathPatching& r, const PathPatching::Path& p) {
  return analysis::Patching::share(p.patched.logit_diff, r.clean.logit_diff, r.corrupted.logit_diff, r.direction == "noising");
}

}  // namespace

nlohmann::json to_json(const PathPatching& r) {
  nlohmann::json paths = nlohmann::json::array();
  for (const PathPatching::Path& p : r.paths) {
    nlohmann::json j = to_json(p.patched);
    j["sender"] = sender_of(p);
    j["receiver"] = receiver_of(p);
    j["input"] = p.input;
    j["loss_share"] = finite_or_null(r.loss_share(p));
    j["logit_diff_share"] = finite_or_null(logit_diff_share(r, p));
    paths.push_back(std::move(j));
  }
  return {{"task", r.task},           {"dir", r.dir},         {"corruption", r.corruption},
          {"direction", r.direction}, {"sequences", r.sequences}, {"length", r.length},
          {"seed", r.seed},           {"clean", to_json(r.clean)}, {"corrupted", to_json(r.corrupted)},
          {"paths", std::move(paths)}};
}

void print_path_patching(std::ostream& out, const PathPatching& r) {
  const bool noising = r.direction == "noising";
  print_patch_runs(out, r.dir, r.task, r.sequences, r.seed, r.length, r.clean, r.corrupted, r.corruption);
  fmt::print(out,
             "path patching, {}: the sender's output from the {} run, every later head held at the {} run's, reaching "
             "only the receiver's input; the share of {}.\n\n",
             r.direction, noising ? "corrupted" : "clean", noising ? "clean" : "corrupted",
             noising ? "the corrupted input's extra loss the path brings into the clean run"
                     : "the clean run's lower loss the path restores in the corrupted run");
  fmt::print(out, "{:<8}{:<10}{:<8}{:>9}{:>9}{:>12}{:>16}{:>21}\n", "sender", "receiver", "input", "accuracy", "loss", "logit diff",
             "share of loss", "share of logit diff");
  for (const PathPatching::Path& p : r.paths)
    fmt::print(out, "{:<8}{:<10}{:<8}{:>9}{:>9.4f}{:>+12.3f}{:>16}{:>21}\n", sender_of(p), receiver_of(p), p.input,
               percent(p.patched.accuracy), p.patched.loss, p.patched.logit_diff, percent(r.loss_share(p)),
               percent(logit_diff_share(r, p)));
}

}  // namespace qkv::report
