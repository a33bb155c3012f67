// qkv patch DIR --component C [--by-position] [--noising] [--attribution] [--n N] [--seed S] [--json] [--svg DIR]:
// activation patching of one component, every layer (and head), at all positions or each apart;
// qkv patch DIR --path [--noising] [--n N] [--seed S] [--json]: path patching, every head into the
// logits and into each later head's q, k and v.
#include <cstdlib>
#include <iostream>
#include <memory>

#include "examples/cli/command.hpp"
#include "qkv/report/path_patching.hpp"
#include "qkv/report/patching.hpp"
#include "qkv/training/run_analysis.hpp"

namespace qkv::cli {

namespace {

struct PatchArgs {
  std::string dir, component, svg;
  std::uint64_t n = 256, seed = 1;
  bool by_position = false, noising = false, attribution = false, path = false, json = false;
};

}  // namespace

void add_patch(CLI::App& app, Command& run) {
  auto a = std::make_shared<PatchArgs>();
  std::string components;
  for (const analysis::PatchComponent c : analysis::all_patch_components)
    components += (components.empty() ? "" : ", ") + analysis::patch_component_name(c);
  auto* sub = app.add_subcommand("patch", "Activation patching between the task's clean and corrupted inputs, one "
                                          "component at every layer (and head), at all positions or each apart");
  sub->add_option("DIR", a->dir, "Run folder (as qkv train --out) of a task with a corrupted input (induction)")->required();
  auto* component = sub->add_option("--component", a->component, "What to patch: " + components);
  component->check([](const std::string& name) {
        try {
          analysis::patch_component(name);
          return std::string();
        } catch (const std::invalid_argument& e) {
          return std::string(e.what());
        }
      });
  auto* path = sub->add_flag("--path", a->path,
                             "Path patching: each head's output reaching only the logits, or one later head's q, k or v");
  path->excludes(component);
  auto* by_position =
      sub->add_flag("--by-position", a->by_position, "Each position apart (pattern: each query and key) rather than all at once");
  sub->add_flag("--noising", a->noising,
                "The clean run with corrupted activations, rather than the corrupted run with clean ones (denoising)");
  auto* attribution = sub->add_flag(
      "--attribution", a->attribution,
      "Attribution patching: every patch's loss estimated to first order from two forwards and backwards");
  auto* svg = sub->add_option("--svg", a->svg, "Write the heatmaps as SVG files into this folder");
  for (auto* o : {by_position, attribution, svg}) path->excludes(o);
  sub->add_option("--n", a->n, "Held-out sequences, drawn as one batch")->check(whole(1, analysis::max_patch_sequences));
  sub->add_option("--seed", a->seed, "Seed of the held-out sequences (as qkv eval's)")->check(whole(0, UINT64_MAX));
  sub->add_flag("--json", a->json, "Print the numbers as one JSON object");
  sub->callback([&run, a] {
    if (!a->path && a->component.empty()) throw CLI::RequiredError("--component or --path");
    run = [a] {
      if (a->path) {
        const analysis::PathPatching p = training::path_patch_run(
            a->dir, {.noising = a->noising, .sequences = std::size_t(a->n), .seed = a->seed});
        if (a->json) fmt::print("{}\n", report::to_json(p).dump());
        else report::print_path_patching(std::cout, p);
        return 0;
      }
      const analysis::Patching p = training::patch_run(a->dir, a->attribution, {.component = analysis::patch_component(a->component),
                                                                .by_position = a->by_position,
                                                                .noising = a->noising,
                                                                .sequences = std::size_t(a->n),
                                                                .seed = a->seed});
      if (!a->svg.empty()) {
        std::vector<std::pair<std::string, std::string>> svgs;
        for (const auto& [name, map] : report::patching_heatmaps(p)) svgs.emplace_back(name, report::heatmap_svg(map));
        const auto files = report::write_svg_files(a->svg, svgs);
        fmt::print(stderr, "qkv patch: wrote {} SVG files to {}\n", files.size(), a->svg);
      }
      if (a->json) fmt::print("{}\n", report::to_json(p).dump());
      else report::print_patching(std::cout, p, escapes_shown(1) && std::getenv("NO_COLOR") == nullptr);
      return 0;
    };
  });
}

}  // namespace qkv::cli
