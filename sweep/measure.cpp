#include "qkv/sweep/measure.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <type_traits>

#include <fmt/format.h>

#include "qkv/analysis/inspect.hpp"
#include "qkv/nn/checkpoint.hpp"
#include "qkv/nn/circuits.hpp"
#include "qkv/nn/files.hpp"
#include "qkv/tasks/evaluate.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/training/options.hpp"
#include "qkv/training/run_folder.hpp"
#include "qkv/training/trainer.hpp"

namespace qkv::sweep {

using Json = nlohmann::ordered_json;

namespace {

// σ of the head the task reads: head 0 of the last layer. A seq2seq model has no such head (its
// output is read through every cross-attention head, which share the source between them): the mean
// over the last decoder layer's cross-attention heads.
double readout_sigma(const nn::Transformer& m) { return nn::symmetric_share(nn::qk_circuit(m.blocks.back()->attn, 0)); }
double readout_sigma(const nn::EncoderDecoder& m) {
  const nn::MultiHeadAttention& cross = m.decoder.back()->cross_attn;
  double total = 0;
  const std::size_t heads = m.config().heads;
  for (std::size_t h = 0; h < heads; ++h) total += nn::symmetric_share(nn::qk_circuit(cross, h));
  return total / double(heads);
}

// The readout head's softmax-invariant score asymmetry, averaged over the inputs that have one; null
// when none has (a causal model, and a seq2seq model, whose cross-attention scores are not square).
Json readout_score_asymmetry(const nn::Transformer& m, const Sequences& inputs) {
  double total = 0, n = 0;
  for (const auto& input : inputs)
    if (const std::optional<double> a = analysis::score_asymmetries(m, input).back()[0]) total += *a, ++n;
  return n > 0 ? Json(total / n) : Json(nullptr);
}
Json readout_score_asymmetry(const nn::EncoderDecoder&, const Sequences&) { return nullptr; }

}  // namespace

std::vector<std::size_t> curve_steps(std::size_t steps) {
  std::vector<std::size_t> out = {0};
  for (std::size_t decade = 10; decade < steps; decade *= 10)
    for (const std::size_t m : {1, 2, 3, 5})
      if (m * decade < steps) out.push_back(m * decade);
  if (steps > 0) out.push_back(steps);
  return out;
}

namespace {

struct CurvePoint {
  Json point;
  std::vector<std::string> violations;
};

// Drops the points of `step` and later: what a resumed run measures again.
void drop_from(std::vector<CurvePoint>& points, std::size_t step) {
  while (!points.empty() && points.back().point["step"].get<std::size_t>() >= step) points.pop_back();
}

// A curve file's points, a line each ({"point": …, "violations": […]}), up to the first line that
// is not one whole (what a write that died left). A line replaces those of its step and later,
// which a run resumed from an earlier checkpoint measured again.
std::vector<CurvePoint> read_curve(const std::string& file) {
  std::vector<CurvePoint> points;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    const Json j = Json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("point") || !j["point"].is_object() ||
        !j["point"].contains("step") || !j["point"]["step"].is_number_unsigned() || !j.contains("violations") ||
        !j["violations"].is_array())
      break;
    drop_from(points, j["point"]["step"].get<std::size_t>());
    CurvePoint p{.point = j["point"], .violations = {}};
    for (const Json& v : j["violations"])
      if (v.is_string()) p.violations.push_back(v.get<std::string>());
    points.push_back(std::move(p));
  }
  return points;
}

void append_curve_point(const std::string& file, const Json& point, const std::vector<std::string>& violations) {
  std::ofstream out(file, std::ios::app);
  out << Json{{"point", point}, {"violations", violations}}.dump() << "\n" << std::flush;
  if (!out) throw std::runtime_error(fmt::format("{}: the curve's point of step {} was not written", file, point["step"].dump()));
}

// measure_run for a decoder-only `Model` (nn::Transformer) or a seq2seq one (nn::EncoderDecoder).
template <class Model>
void measure(Json& run, const TrainOptions& o, const Extras& extras, std::vector<std::string>& violations,
             std::ostream& progress, bool tty, const std::string& curve_file) {
  constexpr bool decoder_only = std::is_same_v<Model, nn::Transformer>;
  const auto task = tasks::make_task(o);
  // The held-out sequences of a decoder-only run (a seq2seq task's samples are two sides).
  const Sequences sequences = decoder_only ? held_out_sequences(*task, 16, o.seed) : Sequences{};
  const tasks::TaskSpec& task_info = tasks::task_spec(o.task);
  if constexpr (decoder_only)
    if (extras.at_init) {
      Generator gen(o.seed);  // the same init as train()'s
      nn::Transformer init(o.model, gen);
      extras.at_init(run, init, *task, sequences, o.seed);
    }
  // The curve: accuracy (on the final evaluation's held-out sequences), σ, asymmetry and the
  // task's probe at log-spaced steps, from the init (step 0) to the end.
  const std::vector<std::size_t> at = curve_steps(o.steps);
  // Each point with the probe's broken bounds at it; with a curve file, each is appended there as it
  // is measured, and a resumed run starts from the points the file holds.
  std::vector<CurvePoint> points;
  if (!curve_file.empty() && o.resume) points = read_curve(curve_file);
  if (!curve_file.empty() && !o.resume) std::filesystem::remove(curve_file);
  const auto observe = [&](std::size_t step, const Model& model) {
    if (!std::binary_search(at.begin(), at.end(), step)) return;
    drop_from(points, step);  // a resumed run measures again from its checkpoint's step on
    std::vector<std::string> broken;
    Json point = {{"step", step},
                  {"accuracy", tasks::evaluate(model, *task, o.eval_batches, o.batch, o.seed, o.mask_padding).accuracy},
                  {"sigma", readout_sigma(model)},
                  {"score_asymmetry", readout_score_asymmetry(model, sequences)}};
    if constexpr (decoder_only)
      if (task_info.probe) {
        const tasks::Probe probe = task_info.probe(model, o.seed);
        for (const auto& [key, value] : probe.values) point[key] = value;
        for (const std::string& v : probe.violations) broken.push_back(fmt::format("at step {}: {}", step, v));
      }
    if (!curve_file.empty()) append_curve_point(curve_file, point, broken);
    points.push_back({std::move(point), std::move(broken)});
  };
  training::TrainResult r;
  if constexpr (decoder_only) r = training::train(o, progress, tty, observe);
  else r = training::train(o, progress, tty, {}, observe);
  Json curve = Json::array();
  for (CurvePoint& p : points) {
    curve.push_back(std::move(p.point));
    violations.insert(violations.end(), p.violations.begin(), p.violations.end());
  }
  if (curve.empty() || curve.front()["step"] != 0 || curve.back()["step"] != r.steps)
    throw std::logic_error(fmt::format("{}: the run's curve does not run from step 0 to step {}", o.out, r.steps));
  const Json& first = curve.front();
  const Json& last = curve.back();
  run["accuracy"] = r.eval.accuracy;
  run["steps_to_target"] = r.steps_to_target ? Json(*r.steps_to_target) : Json(nullptr);
  run["target"] = o.target;
  run["steps"] = r.steps;
  run["seconds"] = r.seconds;
  run["sigma_init"] = first["sigma"];
  run["sigma"] = last["sigma"];
  run["score_asymmetry_init"] = first["score_asymmetry"];
  run["score_asymmetry"] = last["score_asymmetry"];
  if constexpr (decoder_only) {
    if (extras.at_end) extras.at_end(run, *training::load_model(o.out), *task, sequences);
    if (extras.of_folder) extras.of_folder(run, o.out);
  } else if (extras.seq2seq_at_end) {
    extras.seq2seq_at_end(run, *training::load_encoder_decoder(o.out), *tasks::as_seq2seq(*task));
  }
  for (const auto& [key, value] : last.items())  // the probe's values at the end
    if (!run.contains(key) && key != "step") run[key] = value;
  run["curve"] = std::move(curve);
  run["config"] = Json::parse(nn::read_file(o.out + "/config.json", 1 << 20));  // as train recorded it
}

}  // namespace

void measure_run(Json& run, const TrainOptions& o, const Extras& extras, std::vector<std::string>& violations,
                 std::ostream& progress, bool tty, const std::string& curve_file) {
  if (o.encoder_layers) measure<nn::EncoderDecoder>(run, o, extras, violations, progress, tty, curve_file);
  else measure<nn::Transformer>(run, o, extras, violations, progress, tty, curve_file);
}

std::optional<std::size_t> resumable_step(const TrainOptions& o, const std::string& curve_file) {
  try {
    const std::optional<std::string> folder = nn::committed_checkpoint(o.out);
    const std::optional<std::size_t> step = folder ? nn::checkpoint_step(*folder) : std::nullopt;
    if (!step || *step > o.steps) return std::nullopt;
    training::check_resume_options(training::read_config(o.out), o);  // config.json records neither resume nor force
    // The file's points ascend (read_curve keeps the last of a step): they must begin with the
    // curve's steps up to the checkpoint's.
    const std::vector<CurvePoint> points = read_curve(curve_file);
    std::size_t i = 0;
    for (const std::size_t s : curve_steps(o.steps))
      if (s <= *step && (i >= points.size() || points[i++].point["step"] != s)) return std::nullopt;
    return step;
  } catch (const std::exception&) {  // no run there, or another one: it trains from the start
    return std::nullopt;
  }
}

}  // namespace qkv::sweep
