// qkv inspect DIR [--input TEXT] [--json] [--html FILE] [--svg DIR]: what the heads of a trained
// run learned, as tables and heatmaps, JSON, an HTML page or SVG files; with --across-training,
// measured at each checkpoint the run kept.
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <variant>

#include "examples/cli/command.hpp"
#include "qkv/nn/files.hpp"
#include "qkv/report/across_training.hpp"
#include "qkv/report/fourier.hpp"
#include "qkv/report/alignment.hpp"
#include "qkv/report/heatmap.hpp"
#include "qkv/report/inspect.hpp"
#include "qkv/training/run_analysis.hpp"

namespace qkv::cli {

namespace {

struct InspectArgs {
  std::string dir, input, html, svg;
  bool json = false, across_training = false, fourier = false;
};

// A measure along training as --svg and --json ask (its charts, its JSON), or its tables.
template <class Series, class Charts, class Print>
int show_series(const InspectArgs& a, const Series& series, Charts charts, Print print) {
  if (!a.svg.empty()) {
    const auto files = report::write_svg_files(a.svg, charts(series));
    fmt::print(stderr, "qkv inspect: wrote {} SVG files to {}\n", files.size(), a.svg);
  }
  if (a.json) fmt::print("{}\n", report::to_json(series).dump());
  else if (a.svg.empty()) print(std::cout, series);
  return 0;
}

// --fourier: a modular-addition run in the Fourier basis, and along training.
int fourier(const InspectArgs& a) {
  analysis::FourierRun r;
  try {
    r = training::fourier_run(a.dir);
  } catch (const std::invalid_argument& e) {
    usage("--fourier", "{}", e.what());
  }
  return show_series(a, r, report::fourier_charts, report::print_fourier);
}

// --across-training: the kept checkpoints' measures as JSON, SVG charts or tables.
int across_training(const InspectArgs& a) {
  return show_series(a, training::across_training_run(a.dir), report::across_training_charts,
                     report::print_across_training);
}

// Writes the report of an inspection as --html, --svg and --json ask, or prints it.
template <class Inspection>
int show(const InspectArgs& a, const Inspection& in) {
  if (!a.html.empty()) {
    nn::write_atomically(a.html, report::to_html(in));
    fmt::print(stderr, "qkv inspect: wrote {}\n", a.html);
  }
  if (!a.svg.empty()) {
    const auto files = report::write_svgs(in, a.svg);
    fmt::print(stderr, "qkv inspect: wrote {} SVG files to {}\n", files.size(), a.svg);
  }
  if (a.json) {
    fmt::print("{}\n", report::to_json(in).dump());
  } else if (a.html.empty() && a.svg.empty()) {
    const bool color = escapes_shown(1) && std::getenv("NO_COLOR") == nullptr;
    report::print_report(std::cout, in, color);
  }
  return 0;
}

int run_inspect(const InspectArgs& a) {
  if (a.across_training) return across_training(a);
  if (a.fourier) return fourier(a);
  const training::RunInfo run = training::open_run(a.dir);
  std::optional<std::vector<std::int64_t>> input;
  if (a.input.empty() && run.library_run())
    usage("--input", "is needed: {} is a library program's run (its config.json names no task); give its tokens as "
          "ids or the names it saved", a.dir);
  if (!a.input.empty()) {
    try {
      input = training::parse_input(run, a.input);
    } catch (const std::invalid_argument& e) {
      usage("--input", "{}", e.what());
    }
  }
  const bool pictures = !a.html.empty() || !a.svg.empty();  // only the pictures draw the training
  return std::visit([&](const auto& in) { return show(a, in); }, training::inspect_run(run, input, pictures, !a.html.empty()));
}

}  // namespace

void add_inspect(CLI::App& app, Command& run) {
  auto a = std::make_shared<InspectArgs>();
  auto* sub = app.add_subcommand("inspect", "Show what W_q, W_k and W_v of a trained run learned");
  sub->add_option("DIR", a->dir, "Run folder (as qkv train --out)")->required();
  auto* input = sub->add_option("--input", a->input, "A sequence of the task (default: a typical one)");
  sub->add_flag("--json", a->json, "Print the numbers as one JSON object");
  auto* html = sub->add_option("--html", a->html, "Write a self-contained HTML page of heatmaps to this file");
  sub->add_option("--svg", a->svg, "Write each heatmap as an SVG file into this folder");
  sub->add_flag("--across-training", a->across_training,
                "Measure every checkpoint the run kept (train --keep-checkpoints): held-out loss, in-context score, each "
                "head's σ, detectors, prefix matching, patching and direct logit attribution, composition")
      ->excludes(input)
      ->excludes(html);
  sub->add_flag("--fourier", a->fourier,
                "A modular-addition run (modadd) in the Fourier basis of Z_p: key frequencies, embedding and unembedding "
                "norms, neurons, heads, restricted and excluded losses; along training at each kept checkpoint")
      ->excludes(input)
      ->excludes(html)
      ->excludes("--across-training");
  sub->callback([&run, a] { run = [a] { return run_inspect(*a); }; });
}

}  // namespace qkv::cli
