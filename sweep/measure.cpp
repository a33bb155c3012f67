#include "qkv/sweep/measure.hpp"

#include <algorithm>
#include <ostream>
#include <type_traits>

#include <fmt/format.h>

#include "qkv/analysis/inspect.hpp"
#include "qkv/nn/circuits.hpp"
#include "qkv/nn/files.hpp"
#include "qkv/tasks/evaluate.hpp"
#include "qkv/tasks/registry.hpp"
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

// measure_run for a decoder-only `Model` (nn::Transformer) or a seq2seq one (nn::EncoderDecoder).
template <class Model>
void measure(Json& run, const TrainOptions& o, const Extras& extras, std::vector<std::string>& violations,
             std::ostream& progress, bool tty) {
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
  Json curve = Json::array();
  const auto observe = [&](std::size_t step, const Model& model) {
    if (!std::binary_search(at.begin(), at.end(), step)) return;
    Json point = {{"step", step},
                  {"accuracy", tasks::evaluate(model, *task, o.eval_batches, o.batch, o.seed, o.mask_padding).accuracy},
                  {"sigma", readout_sigma(model)},
                  {"score_asymmetry", readout_score_asymmetry(model, sequences)}};
    if constexpr (decoder_only)
      if (task_info.probe) {
        const tasks::Probe probe = task_info.probe(model, o.seed);
        for (const auto& [key, value] : probe.values) point[key] = value;
        for (const std::string& v : probe.violations) violations.push_back(fmt::format("at step {}: {}", step, v));
      }
    curve.push_back(std::move(point));
  };
  training::TrainResult r;
  if constexpr (decoder_only) r = training::train(o, progress, tty, observe);
  else r = training::train(o, progress, tty, {}, observe);
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
                 std::ostream& progress, bool tty) {
  if (o.encoder_layers) measure<nn::EncoderDecoder>(run, o, extras, violations, progress, tty);
  else measure<nn::Transformer>(run, o, extras, violations, progress, tty);
}

}  // namespace qkv::sweep
