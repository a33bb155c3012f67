#include "tests/training/short_run.hpp"

#include <cmath>

#include <nlohmann/json.hpp>
#include <xtensor/xview.hpp>

#include "qkv/analysis/across_training.hpp"
#include "qkv/nn/checkpoint.hpp"
#include "qkv/nn/circuits.hpp"
#include "qkv/report/across_training.hpp"
#include "qkv/training/kept_checkpoints.hpp"
#include "qkv/training/run_analysis.hpp"
#include "tests/analysis/induction_setup.hpp"

using namespace qkv;
using namespace qkv::analysis;
using namespace qkv::test;
using Catch::Matchers::Contains;

TEST_CASE("across training: the half-way step of a series, by hand") {
  using Series = std::vector<std::pair<std::size_t, double>>;
  // Half-way from 0 to 1 is 0.5: passed at 10, fallen back at 20, past for good from 30 on.
  CHECK(half_way_step(Series{{0, 0}, {10, 0.6}, {20, 0.2}, {30, 0.8}, {40, 1.0}}) == 30);
  CHECK(half_way_step(Series{{0, 4}, {5, 3.5}, {9, 2.4}, {12, 1}}) == 9);  // falling: below 2.5 from 9 on
  CHECK(half_way_step(Series{{0, 1}, {5, 1}}) == std::nullopt);
  CHECK(half_way_step(Series{{0, 1}}) == std::nullopt);
}

TEST_CASE("across training: the circuit's formation from series made by hand") {
  // Two layers of one head; L0H0 becomes a previous-token head and L1H0 an induction head.
  const auto made = [](std::vector<std::size_t> steps, std::vector<double> previous, std::vector<double> induction,
                       std::vector<double> k, std::vector<double> loss) {
    AcrossTraining a;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      CheckpointMeasures c;
      c.step = steps[i];
      c.loss = loss[i];
      c.heads = {{HeadMeasures{}}, {HeadMeasures{}}};
      c.heads[0][0].detection = {.layer = 0, .head = 0, .previous_token = previous[i], .duplicate_token = 0, .induction = 0.01};
      c.heads[1][0].detection = {.layer = 1, .head = 0, .previous_token = 0.02, .duplicate_token = 0, .induction = induction[i]};
      c.composition = {{.from_layer = 0, .from_head = 0, .to_layer = 1, .to_head = 0, .q = 0.1, .k = k[i], .v = 0.1}};
      a.checkpoints.push_back(c);
    }
    return formation(a);
  };
  // All three pass half-way at step 20, the loss (4 → 0.5, half 2.25) too.
  const Formation f = made({0, 10, 20, 30}, {0.1, 0.1, 0.6, 0.6}, {0, 0, 0.5, 0.5}, {0.2, 0.2, 0.4, 0.4}, {4, 4, 1, 0.5});
  CHECK(f.circuit.previous_token.layer == 0);
  CHECK(f.circuit.induction.layer == 1);
  CHECK(f.circuit.previous_token_step == 20);
  CHECK(f.circuit.induction_step == 20);
  CHECK(f.circuit.k_composition_step == 20);
  CHECK(f.circuit.together == true);
  CHECK(f.circuit.before_loss == true);
  // The induction head at 40, with step 30 kept between: not together, and after the loss's 20.
  const Formation late = made({0, 10, 20, 30, 40}, {0.1, 0.1, 0.6, 0.6, 0.6}, {0, 0, 0, 0.1, 0.5}, {0.2, 0.2, 0.4, 0.4, 0.4},
                              {4, 4, 1, 0.8, 0.5});
  CHECK(late.circuit.induction_step == 40);
  CHECK(late.circuit.together == false);
  CHECK(late.circuit.before_loss == false);
  // Adjacent kept steps (20, then 30) are together.
  CHECK(made({0, 10, 20, 30}, {0.1, 0.1, 0.6, 0.6}, {0, 0, 0, 0.5}, {0.2, 0.2, 0.4, 0.4}, {4, 4, 1, 0.5}).circuit.together == true);
}

TEST_CASE("across training: the in-context score against the model's loss on the early and the late positions") {
  const auto model = induction_model(11);
  const tasks::InductionTask task;
  Generator gen = tasks::held_out_generator(3);
  const tasks::Batch batch = task.sample(6, gen);
  const std::size_t T = batch.tokens.shape()[1], quarter = T / 4;
  const auto ic = in_context(*model, model->forward(batch.tokens), batch);
  REQUIRE(ic);
  // The model's own mean cross-entropy with the next token as the target at those positions only.
  const auto loss_over = [&](std::size_t from, std::size_t to) {
    IndexArray targets = tasks::filled(6, T, -100);
    for (std::size_t b = 0; b < 6; ++b)
      for (std::size_t t = from; t < to; ++t) targets(b, t) = batch.tokens(b, t + 1);
    return model->loss(model->forward(batch.tokens), targets).item();
  };
  CHECK(ic->early == Approx(loss_over(0, quarter)).epsilon(1e-12));
  CHECK(ic->late == Approx(loss_over(T - 1 - quarter, T - 1)).epsilon(1e-12));
  CHECK(ic->score() == ic->late - ic->early);
  // A pointer model predicts positions, not tokens: no score.
  nn::TransformerConfig pointer = tasks::default_options("brackets").model;
  Generator g(1);
  const nn::Transformer brackets(pointer, g);
  CHECK_FALSE(in_context(brackets, model->forward(batch.tokens), batch));

  // Prefix matching: the weight a second-copy query puts on the token after its earlier copy.
  const auto prefix = prefix_matching(*model, 4, 2);
  Generator draw = tasks::held_out_generator(2);
  const std::size_t n = model->config().max_len / 2;
  IndexArray tokens = tasks::filled(4, 2 * n, 0);
  for (std::size_t b = 0; b < 4; ++b)
    for (std::size_t t = 0; t < n; ++t) tokens(b, t) = tokens(b, t + n) = std::int64_t(draw.next_u64() % model->config().vocab_size);
  const Array<double> w = model->forward(tokens, true).attention[1].weights.value<double>();
  double sum = 0;
  for (std::size_t b = 0; b < 4; ++b)
    for (std::size_t q = n; q < 2 * n; ++q) sum += w(b, 1, q, q + 1 - n);
  CHECK(prefix[1][1] == Approx(sum / double(4 * n)).epsilon(1e-12));
}

TEST_CASE("across training: each kept checkpoint measured with its own weights, the last the run's model") {
  tasks::TrainOptions o = short_run("induction", "across", 40);
  o.keep_checkpoints = "every:20";
  std::ostringstream progress;
  train(o, progress, false);
  const AcrossTraining a = training::across_training_run(o.out, {.sequences = 16});
  REQUIRE(a.checkpoints.size() == 3);
  CHECK(a.checkpoints[1].step == 20);
  // The last: the run's final model, measured directly.
  const auto model = training::load_model(o.out);
  const CheckpointMeasures last = measure_checkpoint(*model, *tasks::make_task("induction"),
                                                     tasks::task_spec("induction").corruption, 40, {.sequences = 16});
  CHECK(a.checkpoints[2].loss == last.loss);
  CHECK(a.checkpoints[2].in_context->late == last.in_context->late);
  CHECK(a.checkpoints[2].heads[1][0].noising_share == last.heads[1][0].noising_share);
  CHECK(a.checkpoints[2].heads[1][0].detection.induction == last.heads[1][0].detection.induction);
  CHECK(a.checkpoints[2].composition[0].k == last.composition[0].k);
  // The first: the weights at init, read from their file.
  nn::load_weights(nn::load_safetensors(training::kept_checkpoint_path(o.out, 0)), "step 0", *model);
  CHECK(a.checkpoints[0].heads[0][0].sigma == nn::symmetric_share(nn::qk_circuit(model->blocks[0]->attn, 0)));
  CHECK(a.checkpoints[0].heads[0][0].sigma != last.heads[0][0].sigma);

  const nlohmann::json j = report::to_json(a);
  REQUIRE(j.at("checkpoints").size() == 3);
  CHECK(j.at("checkpoints")[2].at("heads")[1].at("induction").get<double>() == last.heads[1][0].detection.induction);
  CHECK(j.at("checkpoints")[2].at("in_context").at("score").get<double>() == last.in_context->score());
  CHECK(j.at("half_way").at("heads").size() == 2);
  std::ostringstream text;
  report::print_across_training(text, a);
  CHECK_THAT(text.str(), Contains(fmt::format("{:>8}{:>10.4f}", 40, last.loss)));
  const auto charts = report::across_training_charts(a);
  REQUIRE(charts.size() == 2);
  CHECK_THAT(charts[1].second, Contains("prefix matching"));

  // A count of sequences out of range is refused, naming it, before anything runs.
  for (const std::size_t n : {std::size_t(0), max_patch_sequences + 1})
    CHECK_THROWS_WITH(training::across_training_run(o.out, {.sequences = n}),
                      Contains(fmt::format("across training: {} held-out sequences (1 to 10000", n)));
  // A run that kept none is refused, naming it and the option.
  tasks::TrainOptions plain = short_run("induction", "across_none", 10);
  train(plain, progress, false);
  CHECK_THROWS_WITH(training::across_training_run(plain.out), Contains(plain.out + ": the run kept no checkpoints") &&
                                                                   Contains("--keep-checkpoints"));
  std::filesystem::remove_all(o.out);
  std::filesystem::remove_all(plain.out);
}
