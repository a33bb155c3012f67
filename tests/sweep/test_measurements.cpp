#include "tests/helpers.hpp"

#include <algorithm>
#include <memory>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "qkv/analysis/ablate.hpp"
#include "qkv/analysis/across_training.hpp"
#include "qkv/analysis/fourier.hpp"
#include "qkv/analysis/history.hpp"
#include "qkv/analysis/inspect.hpp"
#include "qkv/analysis/logit_attribution.hpp"
#include "qkv/analysis/path_patching.hpp"
#include "qkv/core/autograd.hpp"
#include "qkv/nn/circuits.hpp"
#include "qkv/nn/files.hpp"
#include "qkv/nn/transformer.hpp"
#include "qkv/sweep/measure.hpp"
#include "qkv/sweep/measurements.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/training/kept_checkpoints.hpp"
#include "qkv/training/run_analysis.hpp"
#include "qkv/training/run_folder.hpp"
#include "qkv/training/trainer.hpp"

using namespace qkv;
using namespace qkv::sweep;

namespace {

// One bidirectional layer of tied heads for rps (seed 2), its W_q scaled by `q_scale`.
std::unique_ptr<nn::Transformer> tied_rps(float q_scale) {
  tasks::TrainOptions o = tasks::default_options("rps");
  o.model.qk = nn::QK::tied;
  o.model.layers = 1;
  o.model.causal = false;
  Generator gen(2);
  auto m = std::make_unique<nn::Transformer>(o.model, gen);
  NoGradGuard no_grad;
  m->blocks[0]->attn.q_proj->weight.mutable_value<float>() *= q_scale;
  return m;
}

// The self_attention measurement of a model for rps on one sequence of its four items.
nlohmann::ordered_json self_attention_of(nn::Transformer& m) {
  nlohmann::ordered_json run;
  measurement("self_attention").extras.at_end(run, m, *tasks::make_task("rps"), Sequences{{0, 1, 2, 3}});
  return run;
}

}  // namespace

TEST_CASE("self_attention: uniform attention and queries of one length, by hand") {
  // Zero W_q and W_k: every score 0, so a causal query at position i spreads 1/(i+1) over the keys
  // it sees; its largest weight is the first key's (ties go to the earliest), never its own past
  // position 0. q = b_q alone: every query the same length, a spread of 0.
  const auto task = tasks::make_task("brackets");
  tasks::TrainOptions o = tasks::default_options("brackets");
  Generator gen(1);
  nn::Transformer m(o.model, gen);
  {
    NoGradGuard no_grad;
    for (const auto& block : m.blocks) {
      block->attn.q_proj->weight.mutable_value<float>().fill(0);
      block->attn.k_proj->weight.mutable_value<float>().fill(0);
      block->attn.k_proj->bias.mutable_value<float>().fill(0);
      block->attn.q_proj->bias.mutable_value<float>().fill(0.5f);
    }
  }
  const Sequences inputs = {{0, 1, 2, 3, 4}, {0, 1, 1, 2, 2, 3, 4}};
  nlohmann::ordered_json run;
  measurement("self_attention").extras.at_end(run, m, *task, inputs);
  // Per head and layer: queries 1..T-1 of each sequence, weight 1/(i+1) on themselves.
  double weight = 0;
  std::size_t queries = 0;
  for (const auto& s : inputs)
    for (std::size_t i = 1; i < s.size(); ++i) weight += 1.0 / double(i + 1), ++queries;
  CHECK(run["self_weight"].get<double>() == Approx(weight / double(queries)).epsilon(1e-6));
  CHECK(run["self_top"].get<double>() == 0.0);
  CHECK(run["query_length_cv"].get<double>() == Approx(0.0).margin(1e-6));
  // Its own token: 1/(i+1) for each key j ≤ i holding input[i] (the second 1 and the second 2 have
  // two); the top key is the first (BOS, token 0), which no later query holds.
  double same = 0;
  for (const auto& s : inputs)
    for (std::size_t i = 1; i < s.size(); ++i)
      same += double(std::count(s.begin(), s.begin() + std::ptrdiff_t(i) + 1, s[i])) / double(i + 1);
  CHECK(same > weight);  // the repeated tokens count
  CHECK(run["same_token_weight"].get<double>() == Approx(same / double(queries)).epsilon(1e-6));
  CHECK(run["same_token_top"].get<double>() == 0.0);
}

TEST_CASE("self_attention: a tied head whose queries differ in length puts a long query on itself") {
  // Tied: k_j = q_j, so s_ii = |q_i|² ≥ |q_i||q_j| ≥ s_ij whenever |q_i| ≥ |q_j|. In a
  // bidirectional layer the longest query of each head sees every key and scores itself highest:
  // at least one query of the 4 in each head has itself as its top key.
  const auto m = tied_rps(1.0f);
  const nlohmann::ordered_json run = self_attention_of(*m);
  CHECK(run["self_top"].get<double>() >= 1.0 / 4.0);
  CHECK(run["query_length_cv"].get<double>() > 0);
  CHECK(run["self_weight"].get<double>() > 0);
  CHECK(run["self_weight"].get<double>() < 1);
}

TEST_CASE("self_attention: the keys holding a query's token, against the forward's weights by hand") {
  // rps tokens 0, 1, 1, 2 through one bidirectional layer of tied heads: the two 1s share a token, so
  // a query of token 1 has two keys of its own token. The shares from the weights the forward returns.
  const auto m = tied_rps(1.0f);
  const std::vector<std::int64_t> input = {0, 1, 1, 2};
  nlohmann::ordered_json run;
  measurement("self_attention").extras.at_end(run, *m, *tasks::make_task("rps"), Sequences{input});
  const Array<double> w = m->forward(tasks::one_row(input), true).attention[0].weights.to(DType::float64).value<double>();
  double weight = 0, top = 0, self = 0;
  std::size_t queries = 0;
  for (std::size_t h = 0; h < w.shape()[1]; ++h)
    for (std::size_t i = 0; i < 4; ++i, ++queries) {
      std::size_t best = 0;
      for (std::size_t j = 0; j < 4; ++j) {
        if (input[j] == input[i]) weight += w(0, h, i, j);
        if (w(0, h, i, j) > w(0, h, i, best)) best = j;
      }
      top += input[best] == input[i];
      self += w(0, h, i, i);
    }
  CHECK(run["same_token_weight"].get<double>() == Approx(weight / double(queries)).epsilon(1e-6));
  CHECK(run["same_token_top"].get<double>() == Approx(top / double(queries)));
  CHECK(run["same_token_top"].get<double>() > 0);
  CHECK(run["same_token_weight"].get<double>() > run["self_weight"].get<double>());  // the other 1 counts
  CHECK(run["self_weight"].get<double>() == Approx(self / double(queries)).epsilon(1e-6));
}

TEST_CASE("self_attention: a query whose weight is all on itself counts, though its other weights round to 0") {
  // The tied head of the previous test with W_q 200 times larger: scores 40,000 times larger, so the
  // longest query's weight on any other key underflows to exactly 0 in float32. It still has keys to
  // choose (finite scores), and chooses itself with weight 1: self_top ≥ 1/4 and self_weight ≥ 1/4
  // over the 4 queries of each head.
  const auto m = tied_rps(200.0f);
  const nn::TransformerOutput f = m->forward(tasks::one_row({0, 1, 2, 3}), true);
  const Array<float> w = f.attention[0].weights.value<float>();
  std::size_t exactly_one = 0;
  for (std::size_t h = 0; h < w.shape()[1]; ++h)
    for (std::size_t i = 0; i < w.shape()[2]; ++i) exactly_one += w(0, h, i, i) == 1.0f;
  REQUIRE(exactly_one > 0);  // the case this is about: weight 1 on itself, 0 elsewhere
  const nlohmann::ordered_json run = self_attention_of(*m);
  CHECK(run["self_top"].get<double>() >= 1.0 / 4.0);
  CHECK(run["self_weight"].get<double>() >= 1.0 / 4.0 - 1e-6);
}

TEST_CASE("token_table: the readout head's token table by the tokens' names, as inspect computes it") {
  const auto task = tasks::make_task("brackets");
  Generator gen(4);
  nn::Transformer m(tasks::default_options("brackets").model, gen);
  nlohmann::ordered_json run;
  measurement("token_table").extras.at_end(run, m, *task, Sequences{});
  // inspect's table is checked by hand in tests/analysis/test_inspect.cpp.
  const analysis::Inspection in = analysis::inspect(m, *task, task->encode("(())"));
  const Array<double>& table = in.layers.back()[0].token_qk;
  REQUIRE(run["token_qk"].size() == 6);
  for (std::size_t q = 0; q < 6; ++q)
    for (std::size_t k = 0; k < 6; ++k) {
      INFO(in.vocabulary[q] << " → " << in.vocabulary[k]);
      CHECK(run["token_qk"][in.vocabulary[q]][in.vocabulary[k]].get<double>() == table(q, k));
    }
  CHECK(run["token_qk"][")"]["("].get<double>() != run["token_qk"]["("][")"].get<double>());  // untied: not symmetric
  CHECK(measurement("token_table").check(tasks::default_options("brackets")) == "");  // names distinct, without dots
}

TEST_CASE("composition: each earlier head into each later head, at init and at the end, named as inspect names them") {
  tasks::TrainOptions o = tasks::default_options("induction");
  o.model.heads = 2;
  const auto task = tasks::make_task("induction");
  Generator gen(5), same(5);
  nn::Transformer m(o.model, gen), init(o.model, same);
  {  // The model the run ends with is another: half of L0H1's values zeroed (a scale alone would
     // leave every normalized score as it was).
    NoGradGuard no_grad;
    auto& w = m.blocks[0]->attn.v_proj->weight.mutable_value<float>();
    for (std::size_t r = 16; r < 24; ++r) xt::row(w, std::ptrdiff_t(r)).fill(0);
  }
  nlohmann::ordered_json run;
  measurement("composition").extras.at_init(run, init, *task, Sequences{}, 5);
  measurement("composition").extras.at_end(run, m, *task, Sequences{});
  std::size_t moved = 0;
  for (const auto& [key, model] : {std::pair<const char*, nn::Transformer*>{"composition_init", &init}, {"composition", &m}}) {
    const std::vector<analysis::HeadComposition> expected = analysis::compositions(*model);
    REQUIRE(expected.size() == 4);  // 2 heads into 2 heads
    for (const analysis::HeadComposition& c : expected) {
      const std::string from = fmt::format("L{}H{}", c.from_layer, c.from_head), to = fmt::format("L{}H{}", c.to_layer, c.to_head);
      INFO(key << ": " << from << " → " << to);
      const auto& scores = run[key][from][to];
      CHECK(scores["q"].get<double>() == c.q);
      CHECK(scores["k"].get<double>() == c.k);
      CHECK(scores["v"].get<double>() == c.v);
    }
  }
  for (const char* to : {"L1H0", "L1H1"})
    moved += run["composition"]["L0H1"][to]["k"] != run["composition_init"]["L0H1"][to]["k"];
  CHECK(moved == 2);  // L0H1's output changed
  CHECK(run["composition"]["L0H0"]["L1H0"] == run["composition_init"]["L0H0"]["L1H0"]);  // L0H0's did not
  CHECK(measurement("composition").check(o) == "");
  o.model.layers = 1;
  CHECK(measurement("composition").check(o) == "composition needs two layers or more");
}

TEST_CASE("heads: each head's detector scores as inspect computes them, and each kind's best head") {
  tasks::TrainOptions o = tasks::default_options("induction");
  o.model.heads = 2;
  const auto task = tasks::make_task("induction");
  Generator gen(7);
  nn::Transformer m(o.model, gen);
  nlohmann::ordered_json run;
  measurement("heads").extras.at_end(run, m, *task, Sequences{});
  const analysis::Inspection in = analysis::inspect(m, *task, analysis::typical_input(*task));
  for (const analysis::HeadKind kind : analysis::all_head_kinds) {
    const std::string name = analysis::head_kind_name(kind);
    double best = -1;
    std::size_t layer = 0, head = 0;
    for (const auto& heads : in.layers)
      for (const analysis::HeadInspection& h : heads) {
        INFO(name << " L" << h.layer << "H" << h.head);
        CHECK(run["heads"][fmt::format("L{}H{}", h.layer, h.head)][name].get<double>() == h.detection.score(kind));
        if (h.detection.score(kind) > best) best = h.detection.score(kind), layer = h.layer, head = h.head;
      }
    CHECK(run["heads"][name + "_best"].get<double>() == best);
    CHECK(run["heads"][name + "_layer"] == layer);
    CHECK(run["heads"][name + "_head"] == head);
  }
}

TEST_CASE("ablation: qkv ablate's numbers for each head, and how many heads the task needs") {
  // An induction model trained 600 steps (past the step its circuit forms), whose heads the task
  // needs; the numbers are analysis::ablate's, checked by hand in tests/analysis.
  std::ostringstream quiet;
  tasks::TrainOptions o = tasks::default_options("induction");
  o.steps = 600;
  o.out = test::scratch("measure_ablation") + "/run";
  training::train(o, quiet, false);
  const auto task = tasks::make_task("induction");
  const auto m = training::load_model(o.out);
  nlohmann::ordered_json run;
  measurement("ablation").extras.at_end(run, *m, *task, Sequences{});
  const analysis::Ablation a = analysis::ablate(*m, *task, tasks::task_spec("induction").corruption, 32, 32, 1);
  const auto& out = run["ablation"];
  CHECK(out["clean"].get<double>() == a.clean.accuracy);
  REQUIRE(a.corrupted);
  CHECK(out["corrupted"].get<double>() == a.corrupted->accuracy);
  REQUIRE(a.heads.size() == 2);
  const auto optional = [](const std::optional<double>& x) { return x ? nlohmann::ordered_json(*x) : nlohmann::ordered_json(); };
  std::vector<std::size_t> by_layer(2, 0);
  for (const analysis::HeadAblation& h : a.heads) {
    const auto& head = out[fmt::format("L{}H{}", h.layer, h.head)];
    CHECK(head["zero"].get<double>() == h.zero.accuracy);
    CHECK(head["mean"].get<double>() == h.mean.accuracy);
    CHECK(head["noising_share"] == optional(h.noising_share));
    CHECK(head["denoising_share"] == optional(h.denoising_share));
    CHECK(head["needed"].get<bool>() == h.needed);
    by_layer[h.layer] += h.needed;
  }
  CHECK(by_layer == std::vector<std::size_t>{1, 1});  // both heads of the circuit
  CHECK(out["needed"].get<std::size_t>() == 2);
  CHECK(out["needed_by_layer"].get<std::vector<std::size_t>>() == by_layer);
  // A pointer task's readout layer is not read through its heads' outputs: it has no entry, and no
  // corrupted input means no shares.
  const auto brackets = tasks::make_task("brackets");
  Generator gen(6);
  nn::Transformer b(tasks::default_options("brackets").model, gen);
  nlohmann::ordered_json pointer;
  measurement("ablation").extras.at_end(pointer, b, *brackets, Sequences{});
  CHECK(pointer["ablation"].contains("L0H0"));
  CHECK(!pointer["ablation"].contains("L1H0"));
  CHECK(pointer["ablation"]["corrupted"].is_null());
  CHECK(pointer["ablation"]["L0H0"]["noising_share"].is_null());
  // A run trained without masking the padding is not ablated as qkv ablate would.
  tasks::TrainOptions unmasked = tasks::default_options("brackets");
  CHECK(measurement("ablation").check(unmasked) == "");
  unmasked.mask_padding = false;
  CHECK_THAT(measurement("ablation").check(unmasked), Catch::Contains("masks the padding keys"));
}

TEST_CASE("paths and formation: path patching, direct logit attribution and the formation steps as the analyses give them") {
  std::ostringstream quiet;
  tasks::TrainOptions o = tasks::default_options("induction");
  o.steps = 600;
  o.keep_checkpoints = "log";
  o.out = test::scratch("measure_paths") + "/run";
  CHECK(measurement("formation").check(o).empty());
  training::train(o, quiet, false);
  const auto task = tasks::make_task("induction");
  const auto m = training::load_model(o.out);
  nlohmann::ordered_json run;
  measurement("heads").extras.at_end(run, *m, *task, Sequences{});
  measurement("paths").extras.at_end(run, *m, *task, Sequences{});
  measurement("formation").extras.of_folder(run, o.out);

  const analysis::PathPatching p =
      analysis::path_patch(*m, *task, *tasks::task_spec("induction").corruption, {.noising = true, .sequences = 256, .seed = 1});
  REQUIRE(p.paths.size() == 5);
  CHECK(run["paths"]["L0H0"]["L1H0"]["k"].get<double>() == p.loss_share(p.paths[2]));
  CHECK(run["paths"]["L0H0"]["logits"].get<double>() == p.loss_share(p.paths[0]));
  CHECK(run["paths"]["prev_to_induction_k"] == run["paths"]["L0H0"]["L1H0"]["k"]);  // L0H0 and L1H0 are the best
  CHECK(run["paths"]["sum_v"].get<double>() == p.loss_share(p.paths[3]));             // the one path into values
  const analysis::LogitAttribution a = analysis::logit_attribution(*m, *task, {.sequences = 256, .seed = 1});
  CHECK(run["logit_attribution"]["L1H0"].get<double>() == a.heads[1][0]);
  CHECK(run["logit_attribution"]["logit_diff"].get<double>() == a.logit_diff);

  const analysis::Formation f = analysis::formation(training::across_training_run(o.out));
  const auto& formed = run["formation"];
  CHECK(formed["loss"] == *f.loss);
  CHECK(formed["L1H0"]["role"] == "induction");
  // The circuit's heads are the roles' own heads here, so its steps are theirs.
  CHECK(formed["induction_step"] == *f.heads[1].step);
  CHECK(formed["previous_token_step"] == *f.heads[0].step);
  CHECK(formed["k_composition_step"] == *f.composition[0].step);
  CHECK(formed["together"] == *f.circuit.together);
  CHECK(formed["before_loss"] == *f.circuit.before_loss);

  // Without kept checkpoints the sweep is refused before anything runs; paths needs a corruption.
  o.keep_checkpoints = "";
  CHECK_THAT(measurement("formation").check(o), Catch::Contains("add \"keep-checkpoints\": \"log\""));
  CHECK_THAT(measurement("paths").check(tasks::default_options("brackets")),
             Catch::Contains("the brackets task has no corrupted input to patch from"));
}

TEST_CASE("grokking: the steps and progress measures of a modadd run as analysis::grokking and fourier_run give them") {
  std::ostringstream quiet;
  tasks::TrainOptions o = tasks::default_options("modadd", 13);
  o.model.d_model = 16;
  o.model.d_mlp = 32;
  o.lr = 1e-2;  // memorises its 50 pairs within the run
  o.steps = 150;
  o.log_every = 10;
  o.keep_checkpoints = "log";
  o.out = test::scratch("measure_grokking") + "/run";
  CHECK(measurement("grokking").check(o).empty());
  training::train(o, quiet, false);
  nlohmann::ordered_json run;
  measurement("grokking").extras.of_folder(run, o.out);
  const auto& out = run["grokking"];
  // The steps, from metrics.jsonl read here: the first logged step at 99% or more.
  std::optional<std::size_t> train_99, test_99;
  std::istringstream lines(nn::read_file(o.out + "/metrics.jsonl", 1 << 20));
  std::size_t logged = 0;
  for (std::string line; std::getline(lines, line); ++logged) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!train_99 && j["accuracy"].get<double>() >= 0.99) train_99 = j["step"].get<std::size_t>();
    if (!test_99 && j["test_accuracy"].get<double>() >= 0.99) test_99 = j["step"].get<std::size_t>();
  }
  CHECK(logged == 15);
  REQUIRE(train_99);  // memorised: the step is a number to compare
  CHECK(out["train_99"] == *train_99);
  CHECK(out["test_99"] == (test_99 ? nlohmann::ordered_json(*test_99) : nlohmann::ordered_json()));
  // The weight norm, the final model's squared parameters summed here; the peak, the kept step of
  // the largest of those along.
  const std::unique_ptr<nn::Transformer> final = nn::load_transformer(o.out);
  double norm = 0;
  for (const Tensor& p : final->parameters())
    for (const float v : p.value<float>()) norm += double(v) * double(v);
  CHECK(out["weight_norm"].get<double>() == Approx(norm).epsilon(1e-12));
  const auto& along = out["along"];
  REQUIRE(along.size() >= 5);
  CHECK(along.front()["step"] == 0);
  CHECK(along.back()["step"] == 150);
  CHECK(along.back()["weight_norm"].get<double>() == Approx(norm).epsilon(1e-12));
  std::size_t peak = 0;
  for (std::size_t i = 1; i < along.size(); ++i)
    if (along[i]["weight_norm"].get<double>() > along[peak]["weight_norm"].get<double>()) peak = i;
  CHECK(out["weight_norm_peak"] == along[peak]["step"]);
  CHECK(along[0]["embed"].size() == 7);  // frequencies 0-6 of Z_13
  const analysis::FourierRun f = training::fourier_run(o.out);
  CHECK(out["key_count"] == f.final.key_frequencies.size());
  CHECK(out["key_frequencies"].size() == f.final.key_frequencies.size());

  o.keep_checkpoints = "";
  CHECK_THAT(measurement("grokking").check(o), Catch::Contains("add \"keep-checkpoints\": \"log\""));
  CHECK_THAT(measurement("grokking").check(tasks::default_options("brackets")),
             Catch::Contains("grokking reads a model of modular addition (modadd), not of brackets"));
}
