#include "qkv/sweep/measurements.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "qkv/analysis/ablate.hpp"
#include "qkv/analysis/across_training.hpp"
#include "qkv/analysis/alignment.hpp"
#include "qkv/analysis/fourier.hpp"
#include "qkv/analysis/history.hpp"
#include "qkv/analysis/inspect.hpp"
#include "qkv/analysis/logit_attribution.hpp"
#include "qkv/analysis/path_patching.hpp"
#include "qkv/core/autograd.hpp"
#include "qkv/core/random.hpp"
#include "qkv/nn/circuits.hpp"
#include "qkv/nn/transformer.hpp"
#include "qkv/report/fourier.hpp"
#include "qkv/tasks/builtin.hpp"
#include "qkv/tasks/evaluate.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/tasks/find_spec.hpp"
#include "qkv/report/heatmap.hpp"
#include "qkv/training/run_analysis.hpp"

namespace qkv::sweep {

namespace {

using Json = nlohmann::ordered_json;

// At init: the mean entropy and the mean largest weight of every attention row, over all heads and
// layers; and ‖∂loss/∂W_q‖ over all layers, on one training batch.
void init_attention(Json& run, nn::Transformer& m, const Task& task, const Sequences& inputs, std::uint64_t seed) {
  double entropy = 0, top = 0;
  std::size_t rows = 0;
  {
    NoGradGuard no_grad;
    for (const auto& input : inputs) {
      for (const auto& r : m.forward(tasks::one_row(input), true).attention) {
        const Array<double> w = r.weights.to(DType::float64).value<double>();  // (1, H, T, T)
        const std::size_t H = w.shape()[1], T = w.shape()[2];
        for (std::size_t h = 0; h < H; ++h)
          for (std::size_t i = 0; i < T; ++i) {
            double e = 0, best = 0;
            for (std::size_t j = 0; j < T; ++j) {
              const double p = w(0, h, i, j);
              if (p > 0) e -= p * std::log(p);
              best = std::max(best, p);
            }
            entropy += e;
            top += best;
            ++rows;
          }
      }
    }
  }
  Generator gen(seed);
  const tasks::Batch b = task.sample(32, gen);
  m.zero_grad();
  m.loss(m.forward(b.tokens, false, tasks::key_padding(m, task, b.tokens)), b.targets).backward();
  double grad = 0;
  for (const auto& block : m.blocks) {
    if (!block->attn.q_proj) continue;
    const Array<double> g = block->attn.q_proj->weight.grad().to(DType::float64).value<double>();
    for (double v : g) grad += v * v;
  }
  m.zero_grad();
  run["entropy_init"] = entropy / double(rows);
  run["max_weight_init"] = top / double(rows);
  run["grad_norm_init"] = std::sqrt(grad);
}

// At the end, on the held-out sequences: how much each query attends its own position (the mean
// weight on it, and the share of queries whose largest weight it is) and the keys holding its own
// token (itself among them), over every head and every query with another key to choose; and how
// much the queries' lengths |q_i| differ (their sd over their mean, per head and sequence,
// averaged). Tied and identity heads score a Gram matrix, where a query at least as long as another
// position's scores itself at least as high as that position. Every layer counts alike: past layer
// 0 a position's stream holds more than its own token, and "its token" is the input's at it.
void self_attention(Json& run, nn::Transformer& m, const Task&, const Sequences& inputs) {
  NoGradGuard no_grad;
  const auto point = [](std::size_t l, const char* name) { return fmt::format("blocks.{}.attn.{}", l, name); };
  std::vector<std::string> points;
  for (std::size_t l = 0; l < m.blocks.size(); ++l)
    for (const char* name : {"hook_q", "hook_attn_scores", "hook_pattern"}) points.push_back(point(l, name));
  double weight = 0, top = 0, token_weight = 0, token_top = 0, spread = 0;
  std::size_t queries = 0, heads = 0;
  for (const auto& input : inputs) {
    const nn::ActivationCache cache = m.run_with_cache(tasks::one_row(input), points);
    for (std::size_t l = 0; l < m.blocks.size(); ++l) {
      const auto at = [&](const char* name) { return cache[point(l, name)].to(DType::float64).value<double>(); };
      const Array<double> q = at("hook_q");            // (1, T, H, d_head)
      const Array<double> s = at("hook_attn_scores");  // (1, H, T, T), −inf where masked
      const Array<double> w = at("hook_pattern");      // (1, H, T, T)
      const std::size_t H = w.shape()[1], T = w.shape()[2], dh = q.shape()[3];
      for (std::size_t h = 0; h < H; ++h) {
        for (std::size_t i = 0; i < T; ++i) {
          // Another key it may attend: a finite score (a weight can round to 0 beside a far larger one).
          std::size_t others = 0, best = 0;
          double same = 0;
          for (std::size_t j = 0; j < T; ++j) {
            others += j != i && std::isfinite(s(0, h, i, j));
            if (w(0, h, i, j) > w(0, h, i, best)) best = j;
            if (input[j] == input[i]) same += w(0, h, i, j);
          }
          if (others == 0) continue;  // the first query of a causal layer sees itself alone
          weight += w(0, h, i, i);
          top += best == i;
          token_weight += same;
          token_top += input[best] == input[i];
          ++queries;
        }
        double sum = 0, squares = 0;  // of the lengths |q_i|
        for (std::size_t i = 0; i < T; ++i) {
          double length = 0;
          for (std::size_t d = 0; d < dh; ++d) length += q(0, i, h, d) * q(0, i, h, d);
          sum += std::sqrt(length), squares += length;
        }
        const double mean = sum / double(T), var = std::max(0.0, squares / double(T) - mean * mean);
        if (mean > 0) spread += std::sqrt(var) / mean, ++heads;
      }
    }
  }
  // The shares are none where no query had another key to choose; the spread where no head had a
  // query of nonzero length.
  const auto share = [&](double x) { return queries ? Json(x / double(queries)) : Json(); };
  run["self_weight"] = share(weight);
  run["self_top"] = share(top);
  run["same_token_weight"] = share(token_weight);
  run["same_token_top"] = share(token_top);
  run["query_length_cv"] = heads ? Json(spread / double(heads)) : Json();
}

using report::head_label;

// The readout head's token table (query token, key token: the score it gives when the stream holds
// that token's embedding alone, as `qkv inspect` draws it), by the tokens' names.
void token_table(Json& run, nn::Transformer& m, const Task& task, const Sequences&) {
  NoGradGuard no_grad;
  const Array<double> t = analysis::head_matrix(nn::table_scores(*m.blocks.back(), m.tok.weight), 0);
  Json table = Json::object();
  for (std::size_t q = 0; q < t.shape()[0]; ++q)
    for (std::size_t k = 0; k < t.shape()[1]; ++k)
      table[task.token_name(std::int64_t(q))][task.token_name(std::int64_t(k))] = t(q, k);
  run["token_qk"] = std::move(table);
}

// Each earlier head's Q-, K- and V-composition into each later head: {"L0H0": {"L1H0": {q, k, v}}}.
Json composition(const nn::Transformer& m) {
  Json out = Json::object();
  for (const analysis::HeadComposition& c : analysis::compositions(m))
    out[head_label(c.from_layer, c.from_head)][head_label(c.to_layer, c.to_head)] = {{"q", c.q}, {"k", c.k}, {"v", c.v}};
  return out;
}

// Each head's detector scores (analysis/heads.hpp) on the 64 held-out sequences inspect reads:
// {"L0H0": {previous_token, duplicate_token, induction}, …}, and for each kind the best score over
// the heads and the layer and head that has it (the first, on a tie): KIND_best, KIND_layer,
// KIND_head.
void head_detectors(Json& run, nn::Transformer& m, const Task& task, const Sequences&) {
  const std::vector<std::vector<std::int64_t>> sequences =
      analysis::detection_sequences(m, task, analysis::inspect_detection_sequences);
  if (sequences.empty()) {  // none to read: the measurement says so rather than stopping the run
    run["heads"] = nullptr;
    return;
  }
  const std::vector<analysis::HeadDetection> found = analysis::detect_heads(m, sequences);
  Json out = Json::object();
  for (const analysis::HeadDetection& d : found)
    for (const analysis::HeadKind kind : analysis::all_head_kinds) out[head_label(d.layer, d.head)][analysis::head_kind_name(kind)] = d.score(kind);
  for (const analysis::HeadKind kind : analysis::all_head_kinds) {
    const analysis::HeadDetection& best = analysis::best_head(found, kind);
    const std::string name = analysis::head_kind_name(kind);
    out[name + "_best"] = best.score(kind);
    out[name + "_layer"] = best.layer;
    out[name + "_head"] = best.head;
  }
  run["heads"] = std::move(out);
}

// Each head ablated in turn (`qkv ablate`'s defaults: 1,024 held-out sequences from seed 1, padding
// keys masked, patched with the task's corruption where it has one): the clean and corrupted
// accuracy; for each head whose output the model reads (not a pointer model's readout layer), its
// accuracy zero- and mean-ablated, the shares of noising and denoising, and whether the task needs
// it; and how many heads it needs, in all and per layer.
void ablation(Json& run, nn::Transformer& m, const Task& task, const Sequences&) {
  const std::string& name = task.info().name;
  const std::vector<std::string> known = tasks::task_names();
  const std::optional<tasks::Corruption> corruption =
      std::find(known.begin(), known.end(), name) != known.end() ? tasks::task_spec(name).corruption : std::nullopt;
  const analysis::Ablation a = analysis::ablate(m, task, corruption, 32, 32, 1);
  const auto optional = [](const std::optional<double>& x) { return x ? Json(*x) : Json(); };
  Json out = {{"clean", a.clean.accuracy}, {"corrupted", a.corrupted ? Json(a.corrupted->accuracy) : Json()}};
  std::vector<std::size_t> by_layer(m.blocks.size(), 0);
  std::size_t needed = 0;
  for (const analysis::HeadAblation& h : a.heads) {
    if (!h.read) continue;
    out[head_label(h.layer, h.head)] = {{"zero", h.zero.accuracy},
                                       {"mean", h.mean.accuracy},
                                       {"noising_share", optional(h.noising_share)},
                                       {"denoising_share", optional(h.denoising_share)},
                                       {"needed", h.needed}};
    needed += h.needed;
    by_layer[h.layer] += h.needed;
  }
  out["needed"] = needed;
  out["needed_by_layer"] = by_layer;
  run["ablation"] = std::move(out);
}

// A seq2seq run's decoder against the task's true alignment, as `qkv inspect` and `qkv eval` measure
// it: each cross-attention head's weight on the aligned source positions and the share of output
// tokens whose top position is aligned (256 held-out sources, seed 1); of the last decoder layer,
// the best head's weight and the share of tokens some head has on top; and the exact match of
// greedy decoding from the start token (1,024 held-out sources, seed 1).
void alignment(Json& run, nn::EncoderDecoder& m, const tasks::Seq2SeqTask& task) {
  const analysis::AlignmentInspection in = analysis::inspect_alignment(m, task, analysis::typical_source(task));
  Json heads = Json::object();
  for (const auto& layer : in.layers)
    for (const analysis::CrossHead& h : layer)
      heads[head_label(h.layer, h.head)] = {{"weight", h.held_out}, {"top1", h.top1}, {"sigma", h.sigma}};
  // The last decoder layer's, as any_head_top1 is.
  double best = 0;
  for (const analysis::CrossHead& h : in.layers.back()) best = std::max(best, h.held_out);
  run["alignment"] = {{"best_weight", best}, {"any_head_top1", in.any_head_top1.back()}, {"heads", std::move(heads)}};
  run["exact_match_generated"] = tasks::evaluate_generation(m, task, 32, 32, 1).exact_match;
}

// Bytes the KV caches of all layers hold per token of one sequence, measured on a real cache.
std::size_t kv_cache_bytes_per_token(const nn::Transformer& m, const std::vector<std::int64_t>& input) {
  NoGradGuard no_grad;
  const nn::TransformerOutput f = m.forward(tasks::one_row(input));
  std::size_t bytes = 0;
  for (std::size_t l = 0; l < m.blocks.size(); ++l) {
    nn::KVCache cache;
    m.blocks[l]->attn.forward(f.inputs[l], {.causal = m.causal(l)}, false, &cache);
    bytes += cache.bytes_per_sequence();
  }
  return bytes / input.size();
}

// Path patching (noising, 256 held-out sequences of seed 1, as qkv patch --path --noising) and
// direct logit attribution (as qkv attribute): {"L0H0": {"logits": share, "L1H0": {q, k, v}}} and
// {"L0H0": part, …, "logit_diff": …}; with the shares of the best previous-token head into the best
// induction head (as the heads measurement finds them), when it is in an earlier layer:
// prev_to_induction_{q,k,v}; and sum_{q,k,v}, the shares of every path into a later head's q, k or
// v, summed (a kv head's k and v once, though the heads of its group share them).
void paths(Json& run, nn::Transformer& m, const Task& task, const Sequences&) {
  const analysis::PathPatching p = analysis::path_patch(m, task, *tasks::task_spec(task.info().name).corruption,
                                                        {.noising = true, .sequences = 256, .seed = 1});
  const auto number = [](double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); };
  Json shares = Json::object();
  std::map<std::string, double> sums{{"q", 0.0}, {"k", 0.0}, {"v", 0.0}};
  std::set<std::tuple<std::size_t, std::size_t, std::size_t, std::string, std::size_t>> summed;
  for (const analysis::PathPatching::Path& x : p.paths) {
    const double share = p.loss_share(x);
    Json& sender = shares[head_label(x.sender_layer, x.sender_head)];
    if (x.input == "logits") {
      sender["logits"] = number(share);
      continue;
    }
    sender[head_label(x.receiver_layer, x.receiver_head)][x.input] = number(share);
    if (summed.insert({x.sender_layer, x.sender_head, x.receiver_layer, x.input, x.receiver_slice}).second) sums[x.input] += share;
  }
  const auto sequences = analysis::detection_sequences(m, task, analysis::inspect_detection_sequences);
  if (!sequences.empty()) {
    const std::vector<analysis::HeadDetection> found = analysis::detect_heads(m, sequences);
    const analysis::HeadDetection &from = analysis::best_head(found, analysis::HeadKind::previous_token),
                                  &to = analysis::best_head(found, analysis::HeadKind::induction);
    if (from.layer < to.layer)
      for (const char* x : {"q", "k", "v"})
        shares[std::string("prev_to_induction_") + x] = shares[head_label(from.layer, from.head)][head_label(to.layer, to.head)][x];
  }
  for (const auto& [input, sum] : sums) shares["sum_" + input] = number(sum);
  run["paths"] = std::move(shares);
  const analysis::LogitAttribution a = analysis::logit_attribution(m, task, {.sequences = 256, .seed = 1});
  Json parts = {{"logit_diff", a.logit_diff}};
  for (std::size_t l = 0; l < a.heads.size(); ++l)
    for (std::size_t k = 0; k < a.heads[l].size(); ++k) parts[head_label(l, k)] = a.heads[l][k];
  run["logit_attribution"] = std::move(parts);
}

// When the circuit formed, from the checkpoints the run kept (analysis::formation, as inspect
// --across-training reads it): the half-way steps of the held-out loss and of each head's role
// score, {"loss": step, "L0H0": {role, step}, …}, and of the induction circuit (Formation::Circuit):
// previous_token_step, induction_step, k_composition_step, together and before_loss (null where
// not defined).
void formation_of(Json& run, const std::string& dir) {
  const analysis::Formation f = analysis::formation(training::across_training_run(dir));
  const auto value = [](const auto& v) { return v ? Json(*v) : Json(nullptr); };
  Json out = {{"loss", value(f.loss)}, {"in_context", value(f.in_context)}};
  for (const auto& h : f.heads)
    out[head_label(h.layer, h.head)] = {{"role", analysis::head_kind_name(h.role)}, {"step", value(h.step)}};
  const analysis::Formation::Circuit& c = f.circuit;
  out["previous_token_step"] = value(c.previous_token_step);
  out["induction_step"] = value(c.induction_step);
  out["k_composition_step"] = value(c.k_composition_step);
  if (c.together) out["together"] = *c.together;
  if (c.together) out["before_loss"] = value(c.before_loss);
  run["formation"] = std::move(out);
}

// Grokking's progress, from the run's log and the Fourier analysis of the checkpoints it kept
// (analysis::grokking, as qkv inspect --fourier reads them): the steps of grokking, the final key
// frequencies and the neurons they explain, the final losses, and at each kept step the losses,
// the weight norm and the embedding's norm per frequency.
void grokking_of(Json& run, const std::string& dir) {
  const analysis::FourierRun f = training::fourier_run(dir);
  const analysis::Grokking g = analysis::grokking(f, analysis::read_history(dir, training::read_config(dir).model).logged);
  const auto value = [](const auto& v) { return v ? Json(*v) : Json(nullptr); };
  const nlohmann::json final = report::to_json(f.final);
  std::size_t explained = 0;
  for (std::size_t k : f.final.key_frequencies) explained += f.final.neurons_per_frequency.at(k);
  Json out = {{"train_99", value(g.train_99)},
              {"test_99", value(g.test_99)},
              {"restricted_step", value(g.restricted)},
              {"excluded_step", value(g.excluded)},
              {"weight_norm_peak", value(g.weight_norm_peak)},
              {"weight_norm_fall", value(g.weight_norm_fall)},
              {"key_frequencies", f.final.key_frequencies},
              {"key_count", f.final.key_frequencies.size()},
              {"key_neurons", double(explained) / double(std::max<std::size_t>(1, f.final.neurons.size()))}};
  for (const char* key : {"train_loss", "test_loss", "restricted_loss", "excluded_loss", "weight_norm", "embed_key_share",
                          "unembed_key_share"})
    out[key] = Json::parse(final.at(key).dump());
  Json along = Json::array();
  for (std::size_t i = 0; i < f.steps.size(); ++i) {
    const nlohmann::json a = report::to_json(f.along[i]);
    Json point = {{"step", f.steps[i]}};
    for (const char* key : {"train_loss", "test_loss", "restricted_loss", "excluded_loss", "weight_norm", "embed_key_share", "embed"})
      point[key] = Json::parse(a.at(key).dump());
    along.push_back(std::move(point));
  }
  out["along"] = std::move(along);
  run["grokking"] = std::move(out);
}

// A column for each longer length range of any task.
std::vector<tasks::Column> longer_columns() {
  std::vector<tasks::Column> columns;
  for (const tasks::TaskSpec& spec : tasks::task_registry())
    for (const tasks::LongerLengths& l : spec.longer)
      if (std::none_of(columns.begin(), columns.end(), [&](const tasks::Column& c) { return c.key == "accuracy_" + l.lengths; }))
        columns.push_back({"accuracy_" + l.lengths, "accuracy " + l.lengths, "{:.3f}"});
  return columns;
}

}  // namespace

const std::vector<Measurement>& measurement_registry() {
  static const std::vector<Measurement> registry = {
      {.name = "init_attention",
       .help = "at init: the attention rows' mean entropy and largest weight, and ‖∂loss/∂W_q‖ on a training batch",
       .columns = {{"entropy_init", "entropy at init", "{:.3f}"},
                   {"max_weight_init", "max weight at init", "{:.3f}"},
                   {"grad_norm_init", "‖∂L/∂W_q‖ at init", "{:.3g}"}},
       .extras = {.at_init = init_attention, .at_end = {}}},
      {.name = "kv_cache",
       .help = "at the end: the bytes the KV caches of all layers hold per token of a sequence",
       .columns = {{"kv_cache_bytes_per_token", "KV cache bytes/token", "{:.0f}"}},
       .extras = {.at_init = {},
                  .at_end = [](Json& run, nn::Transformer& trained, const Task&, const Sequences& sequences) {
                    run["kv_cache_bytes_per_token"] = kv_cache_bytes_per_token(trained, sequences.front());
                  }}},
      {.name = "self_attention",
       .help = "at the end: the mean weight each query puts on its own position and on the keys holding its own "
               "token, the share of queries whose largest weight is on them, and the spread (sd/mean) of the queries' "
               "lengths |q_i|",
       .columns = {{"self_weight", "weight on self", "{:.3f}"},
                   {"self_top", "self the top key", "{:.3f}"},
                   {"same_token_weight", "weight on own token", "{:.3f}"},
                   {"same_token_top", "own token the top key", "{:.3f}"},
                   {"query_length_cv", "|q| sd/mean", "{:.3f}"}},
       .extras = {.at_init = {}, .at_end = self_attention}},
      {.name = "token_table",
       .help = "at the end: the readout head's token table (the score of each query token for each key token, from "
               "their embeddings alone, as qkv inspect draws it), by the tokens' names",
       .columns = {},
       .extras = {.at_init = {}, .at_end = token_table},
       .check = [](const tasks::TrainOptions& o) -> std::string {
         // The names are the keys of a path (token_qk.).( ): distinct, and no dot among them.
         const auto task = tasks::make_task(o);
         std::set<std::string> names;
         for (std::size_t t = 0; t < task->info().vocab_size; ++t) {
           const std::string name = task->token_name(std::int64_t(t));
           if (name.find('.') != std::string::npos) return fmt::format("the token name '{}' holds a '.'", name);
           if (!names.insert(name).second) return fmt::format("two tokens are named '{}'", name);
         }
         return "";
       }},
      {.name = "composition",
       .help = "at init and at the end: each earlier head's Q-, K- and V-composition into each later head",
       .columns = {},
       .extras = {.at_init = [](Json& run, nn::Transformer& init, const Task&, const Sequences&,
                                std::uint64_t) { run["composition_init"] = composition(init); },
                  .at_end = [](Json& run, nn::Transformer& trained, const Task&,
                               const Sequences&) { run["composition"] = composition(trained); }},
       .check = [](const tasks::TrainOptions& o) -> std::string {
         return o.model.layers < 2 ? "composition needs two layers or more" : "";
       }},
      {.name = "heads",
       .help = "at the end: each head's previous-token, duplicate-token and induction scores (TransformerLens's head "
               "detectors) on 64 held-out sequences, as qkv inspect shows them, and for each kind the best score and the layer and "
               "head that has it",
       .columns = {{"heads.previous_token_best", "best previous-token score", "{:.3f}"},
                   {"heads.induction_best", "best induction score", "{:.3f}"}},
       .extras = {.at_init = {}, .at_end = head_detectors}},
      {.name = "paths",
       .help = "at the end: path patching (noising, as qkv patch --path --noising on 256 held-out sequences of seed 1) of "
               "each head into the logits and each later head's q, k and v, and each head's direct logit attribution "
               "(as qkv attribute)",
       .columns = {{"paths.prev_to_induction_k", "previous-token → induction head keys", "{:.3f}"}},
       .extras = {.at_init = {}, .at_end = paths},
       .check = [](const tasks::TrainOptions& o) -> std::string {
         if (!tasks::task_spec(o.task).corruption) return fmt::format("the {} task has no corrupted input to patch from", o.task);
         if (o.model.readout != nn::Readout::token) return "direct logit attribution needs the token readout";
         return o.mask_padding ? "" : "paths masks the padding keys as qkv patch does, and the run trains without";
       }},
      {.name = "formation",
       .help = "after training: when each part of the circuit formed (the half-way steps of the held-out loss and of "
               "each head's role score, as qkv inspect --across-training finds them), from the checkpoints the run keeps "
               "(keep-checkpoints)",
       .columns = {{"formation.induction_step", "induction head formed (step)", "{:.0f}"}},
       .extras = {.at_init = {}, .at_end = {}, .seq2seq_at_end = {}, .of_folder = formation_of},
       .check = [](const tasks::TrainOptions& o) -> std::string {
         return o.keep_checkpoints.empty() ? "formation reads the checkpoints a run keeps: add \"keep-checkpoints\": \"log\" "
                                             "to the sweep's options"
                                           : "";
       }},
      {.name = "grokking",
       .help = "after training a modadd run: the steps its training and held-out accuracy reached 99%, the key "
               "frequencies and the steps of its progress measures (restricted and excluded loss, weight norm) from the "
               "checkpoints it keeps, as qkv inspect --fourier reads them",
       .columns = {{"grokking.test_99", "held-out 99% (step)", "{:.0f}"}, {"grokking.key_count", "key frequencies", "{:.0f}"}},
       .extras = {.at_init = {}, .at_end = {}, .seq2seq_at_end = {}, .of_folder = grokking_of},
       .check = [](const tasks::TrainOptions& o) -> std::string {
         if (!dynamic_cast<const tasks::ModAddTask*>(tasks::make_task(o).get()))
           return fmt::format("grokking reads a model of modular addition (modadd), not of {}", o.task);
         return o.keep_checkpoints.empty() ? "grokking reads the checkpoints a run keeps: add \"keep-checkpoints\": \"log\" "
                                             "to the sweep's options"
                                           : "";
       }},
      {.name = "ablation",
       .help = "at the end: each head zero- and mean-ablated and, where the task has a corrupted input, patched both "
               "ways, as qkv ablate does on 1,024 held-out sequences (seed 1)",
       .columns = {{"ablation.needed", "heads needed", "{:.2f}"}},
       .extras = {.at_init = {}, .at_end = ablation},
       .check = [](const tasks::TrainOptions& o) -> std::string {
         return o.mask_padding ? "" : "ablation masks the padding keys as qkv ablate does, and the run trains without";
       }},
      {.name = "alignment",
       .help = "at the end of a seq2seq run: each cross-attention head's weight on the true alignment and its top-1, the "
               "best head's weight, the share of output tokens some head has on top, and the exact match of greedy "
               "decoding",
       .columns = {{"exact_match_generated", "exact match (generated)", "{:.3f}"},
                   {"alignment.best_weight", "best head's weight on the alignment", "{:.3f}"},
                   {"alignment.any_head_top1", "any head top-1", "{:.3f}"}},
       .extras = {.at_init = {}, .at_end = {}, .seq2seq_at_end = alignment}},
      {.name = "longer_lengths",
       .help = "at the end: accuracy on 1,024 held-out sequences of each range of lengths longer than the task trains on",
       .columns = longer_columns(),
       .extras = {.at_init = {},
                  .at_end =
                      [](Json& run, const nn::Transformer& trained, const Task& task, const Sequences&) {
                        // 1,024 held-out sequences of each length range, from a stream of their own.
                        for (const tasks::LongerLengths& l : tasks::task_spec(task.info().name).longer)
                          run["accuracy_" + l.lengths] = tasks::evaluate(trained, *l.make(), 32, 32, 0x1e9).accuracy;
                      }},
       .check = [](const tasks::TrainOptions& o) -> std::string {
         const tasks::TaskSpec& spec = tasks::task_spec(o.task);
         if (spec.longer.empty()) return fmt::format("the {} task has no longer lengths to test on", o.task);
         std::size_t longest = 0;
         for (const tasks::LongerLengths& l : spec.longer) longest = std::max(longest, l.make()->info().max_len);
         if (o.model.max_len < longest)
           return fmt::format("its longest sequences need 'max-len' {} (the model has {} positions)", longest, o.model.max_len);
         return "";
       }},
  };
  return registry;
}

const Measurement& measurement(const std::string& name) { return tasks::find_spec(measurement_registry(), name, "measurement"); }

Extras chained(std::vector<Extras> parts) {
  std::erase_if(parts, [](const Extras& e) { return !e.at_init && !e.at_end && !e.seq2seq_at_end && !e.of_folder; });
  if (parts.size() == 1) return parts[0];
  Extras out;
  if (parts.empty()) return out;
  out.at_init = [parts](Json& run, nn::Transformer& init, const Task& task, const Sequences& s, std::uint64_t seed) {
    for (const Extras& e : parts)
      if (e.at_init) e.at_init(run, init, task, s, seed);
  };
  out.at_end = [parts](Json& run, nn::Transformer& trained, const Task& task, const Sequences& s) {
    for (const Extras& e : parts)
      if (e.at_end) e.at_end(run, trained, task, s);
  };
  out.seq2seq_at_end = [parts](Json& run, nn::EncoderDecoder& trained, const tasks::Seq2SeqTask& task) {
    for (const Extras& e : parts)
      if (e.seq2seq_at_end) e.seq2seq_at_end(run, trained, task);
  };
  out.of_folder = [parts](Json& run, const std::string& dir) {
    for (const Extras& e : parts)
      if (e.of_folder) e.of_folder(run, dir);
  };
  return out;
}

Extras extras_of(const std::vector<std::string>& names) {
  std::vector<Extras> parts;
  for (const std::string& name : names) parts.push_back(measurement(name).extras);
  return chained(std::move(parts));
}

}  // namespace qkv::sweep
