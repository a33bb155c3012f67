// modadd, the data-set task: its split, its batches, its text, and training on it full batch.
#include "tests/training/short_run.hpp"  // Catch2, after xarray.hpp

#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "qkv/core/autograd.hpp"
#include "qkv/nn/checkpoint.hpp"
#include "qkv/tasks/builtin.hpp"
#include "qkv/training/kept_checkpoints.hpp"
#include "qkv/training/run_analysis.hpp"
#include "qkv/training/run_options.hpp"

using namespace qkv;
using namespace qkv::tasks;
using namespace qkv::test;
using Catch::Matchers::Contains;

namespace {

// The (a, b) pairs of a split's rows, checking each row's tokens and targets on the way.
std::vector<std::pair<std::int64_t, std::int64_t>> pairs_of(const Batch& rows, std::int64_t p) {
  std::vector<std::pair<std::int64_t, std::int64_t>> pairs;
  REQUIRE(rows.tokens.shape()[1] == 3);
  for (std::size_t i = 0; i < rows.tokens.shape()[0]; ++i) {
    const std::int64_t a = rows.tokens(i, 0), b = rows.tokens(i, 1);
    CHECK((0 <= a && a < p && 0 <= b && b < p));
    CHECK(rows.tokens(i, 2) == p);
    CHECK(rows.targets(i, 0) == ignore_target);
    CHECK(rows.targets(i, 1) == ignore_target);
    CHECK(rows.targets(i, 2) == (a + b) % p);
    pairs.emplace_back(a, b);
  }
  return pairs;
}

TrainOptions modadd(std::size_t p, std::uint64_t seed, double fraction = 0.3) {
  TrainOptions o = default_options("modadd", p);
  o.seed = seed;
  o.train_fraction = fraction;
  return o;
}

}  // namespace

TEST_CASE("modadd splits the p squared pairs by its seed: 3830 train and 8939 held out at p 113, each pair once") {
  const auto task = make_task(modadd(113, 0));
  const TaskInfo& info = task->info();
  CHECK(info.vocab_size == 114);
  CHECK(info.n_classes == 114);
  CHECK(info.max_len == 3);
  REQUIRE(task->split());
  const auto train = pairs_of(task->split()->train, 113), test = pairs_of(task->split()->test, 113);
  CHECK(train.size() == 3830);  // ⌊0.3 · 12769⌋, as the paper's int(frac · p²)
  CHECK(test.size() == 8939);
  std::set<std::pair<std::int64_t, std::int64_t>> all(train.begin(), train.end());
  all.insert(test.begin(), test.end());
  CHECK(all.size() == 12769);

  // The same seed splits the same way; another seed another way, about 30% of whose training
  // pairs are also in the first's.
  CHECK(pairs_of(make_task(modadd(113, 0))->split()->train, 113) == train);
  const auto other = pairs_of(make_task(modadd(113, 1))->split()->train, 113);
  const std::set<std::pair<std::int64_t, std::int64_t>> first(train.begin(), train.end());
  std::size_t shared = 0;
  for (const auto& pair : other) shared += first.count(pair);
  CHECK(shared > 1000);
  CHECK(shared < 1300);  // 3830 · 0.3 = 1149 expected, sd about 28

  // Another size and share: ⌊0.5 · 49⌋ = 24 of p = 7.
  const auto small = make_task(modadd(7, 3, 0.5));
  CHECK(small->split()->train.tokens.shape()[0] == 24);
  CHECK(small->split()->test.tokens.shape()[0] == 25);
}

TEST_CASE("modadd draws distinct training rows, the whole split as a full batch, and held-out rows apart") {
  const auto task = make_task(modadd(11, 2));  // 36 train, 85 held out
  const Split& split = *task->split();
  Generator gen(4);
  const Batch whole = task->sample(36, gen);
  CHECK(whole.tokens == split.train.tokens);
  const auto drawn = pairs_of(task->sample(20, gen), 11);
  const auto train = pairs_of(split.train, 11), test = pairs_of(split.test, 11);
  const std::set<std::pair<std::int64_t, std::int64_t>> in_train(train.begin(), train.end()), in_test(test.begin(), test.end());
  CHECK(std::set(drawn.begin(), drawn.end()).size() == 20);
  for (const auto& pair : drawn) CHECK(in_train.count(pair) == 1);
  for (const auto& pair : pairs_of(task->sample_held_out(50, gen), 11)) CHECK(in_test.count(pair) == 1);
  CHECK_THROWS_WITH(task->sample(37, gen), "modadd: a batch of 37 rows from a training split of 36: at most 36 (the whole split)");
  // Held-out sequences for the detectors and measures are held-out rows.
  for (const auto& sequence : held_out_sequences(*task, 10, 0)) {
    REQUIRE(sequence.size() == 3);
    CHECK(in_test.count({sequence[0], sequence[1]}) == 1);
  }
}

TEST_CASE("modadd reads and writes its text, and refuses a share that leaves a split empty") {
  const auto task = make_task("modadd");
  CHECK(task->encode("3 17 =") == std::vector<std::int64_t>{3, 17, 113});
  CHECK(task->decode({3, 17, 113}) == "3 17 =");
  CHECK(task->token_name(113) == "=");
  CHECK(token_names(*task).back() == "=");
  CHECK(invalid_argument_message([&] { task->encode("3 113 ="); }) ==
        "modadd: cannot read '113' in \"3 113 =\": tokens are numbers 0-112 and =");
  CHECK(invalid_argument_message([] { make_task(modadd(113, 0, 1e-5)); }) ==
        "modadd: a train_fraction of 1e-05 leaves 0 of the 12769 pairs to train on and 12769 held out: each needs at least one");

  using training::check_options;
  const auto field = [](TrainOptions o) {
    try {
      check_options(o);
    } catch (const training::OptionError& e) {
      return e.field + ": " + e.what();
    }
    return std::string("(none)");
  };
  CHECK(field(modadd(113, 0)) == "(none)");
  CHECK(field(modadd(113, 0, 1.0)) == "train_fraction: is 1; it must be in (0, 1)");
  CHECK(field(modadd(113, 0, 1e-5)) ==
        "train_fraction: modadd: a train_fraction of 1e-05 leaves 0 of the 12769 pairs to train on and 12769 held out: "
        "each needs at least one");
  TrainOptions big = modadd(113, 0);
  big.batch = 3831;
  CHECK(field(big) == "batch: is 3831, more than the 3830 examples the modadd task trains on (0: all of them, a full batch)");
  TrainOptions brackets = default_options("brackets");
  brackets.train_fraction = 0.5;
  CHECK(field(brackets) == "train_fraction: is 0.5, but the brackets task draws its sequences: it has no split");
  brackets.train_fraction = 0;
  brackets.batch = 0;
  CHECK(field(brackets) == "batch: is 0, a full batch, but the brackets task draws its sequences: give a batch of 1 or more");
  CHECK(training::step_rows(modadd(113, 0)) == 3830);

  // The run options: --p is the size, as --n; not both.
  const TrainOptions o = training::run_options("modadd", {{"p", 59}, {"train-fraction", "0.5"}, {"weight-decay", 0}});
  CHECK(o.n == 59);
  CHECK(o.train_fraction == 0.5);
  CHECK(o.weight_decay == 0);
  CHECK(o.beta2 == 0.98);
  CHECK_THROWS_WITH(training::run_options("modadd", {{"p", 59}, {"n", 59}}), "is the task's size, as --n: give one of them");
  CHECK_THROWS_WITH(training::run_options("cycle", {{"p", 5}}), "is modadd's modulus; the cycle task's size is --n");
}

TEST_CASE("a batch scored at its last position alone runs forward_last: the same loss and predictions") {
  const auto task = make_task(modadd(13, 0));
  TrainOptions o = modadd(13, 0);
  o.model.d_model = 16;
  o.model.d_mlp = 24;
  o.model.dtype = DType::float64;
  Generator gen(1);
  const nn::Transformer model(o.model, gen);
  const Batch& rows = task->split()->train;
  const std::uint64_t before = nn::detail::gathered_runs();
  const Forward f = forward(model, *task, rows, true, true);
  CHECK(nn::detail::gathered_runs() == before + 1);  // 50 pairs of a 14-token vocabulary: gathered
  const nn::TransformerOutput full = model.forward(rows.tokens);
  CHECK(f.loss.item() == Approx(model.loss(full, rows.targets).item()).epsilon(1e-13));
  const IndexArray predicted = nn::Transformer::predictions(full.logits);
  for (std::size_t i = 0; i < rows.tokens.shape()[0]; ++i) {
    CHECK(f.predictions(i, 0) == -1);
    CHECK(f.predictions(i, 2) == predicted(i, 2));
  }
  // evaluate reads the whole held-out split, whatever the batches asked.
  const Metrics m = evaluate(model, *task, 1, 1, 0);
  CHECK(m.scored == task->split()->test.tokens.shape()[0]);
  const RowsScore test = score_rows(model, *task, task->split()->test);
  CHECK(test.metrics.accuracy == m.accuracy);
  CHECK(test.loss == Approx(model.loss(model.forward(task->split()->test.tokens), task->split()->test.targets).item()).epsilon(1e-13));
}

TEST_CASE("modadd trains full batch with AdamW, logs held-out loss and accuracy, and resumes bit for bit") {
  TrainOptions o = short_run("modadd", "modadd", 40, 500, 23);
  o.model.d_model = 32;
  o.model.heads = 2;
  o.model.d_mlp = 64;
  o.warmup = 3;
  o.keep_checkpoints = "every:1";
  std::ostringstream progress;
  training::train(o, progress, false);

  // A line per 10 steps, each with the held-out split's loss and accuracy after that step: the
  // last one equals the trained model's evaluation.
  std::ifstream in(o.out + "/metrics.jsonl");
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  REQUIRE(lines.size() == 4);
  const nlohmann::json evaluated = training::evaluate_run(o.out, 0, 0);
  CHECK(evaluated.at("sequences") == 529 - 158);  // ⌊0.3 · 529⌋ = 158 train
  CHECK(evaluated.at("train").at("sequences") == 158);
  CHECK(lines.back().at("test_accuracy").get<double>() == evaluated.at("accuracy").get<double>());
  CHECK(lines.back().at("test_loss").get<double>() == Approx(evaluated.at("loss").get<double>()).epsilon(1e-6));
  for (const nlohmann::json& line : lines) CHECK(std::isfinite(line.at("test_loss").get<double>()));
  const nlohmann::json config = nlohmann::json::parse(nn::read_file(o.out + "/config.json", 1 << 20));
  CHECK(config.at("beta2") == 0.98);
  CHECK(config.at("weight_decay") == 1.0);
  CHECK(config.at("train_fraction") == 0.3);
  CHECK(config.at("clip") == 0.0);
  CHECK(config.at("batch") == 0);

  // Step 1 by hand from the step-0 weights: AdamW's first step is p (1 − lr·wd) − lr · g / (|g| + eps),
  // the decay decoupled from the gradient; Adam's L2 would move p by lr · sign(g + wd · p) instead.
  const auto task = make_task(o);
  nn::Transformer start(o.model), after(o.model);
  const std::string at0 = training::kept_checkpoint_path(o.out, 0), at1 = training::kept_checkpoint_path(o.out, 1);
  nn::load_weights(nn::load_safetensors(at0), at0, start);
  nn::load_weights(nn::load_safetensors(at1), at1, after);
  forward(start, *task, task->split()->train, true, true).loss.backward();
  const double lr = training::training_schedule(o).lr_at(0);
  const auto moved = after.named_parameters();
  std::size_t i = 0;
  for (const auto& [name, p] : start.named_parameters()) {
    INFO(name);
    const Array<double> p0 = p.to(DType::float64).value<double>(), g = p.grad().to(DType::float64).value<double>();
    const Array<double> expected = p0 * (1 - lr * o.weight_decay) - lr * g / (xt::abs(g) + 1e-8);
    check_close(moved[i++].second, expected, 1e-6);
  }

  // Stopped at step 20 and resumed: the same weights as the run above.
  TrainOptions first = o;
  first.out = temp_folder("train_modadd_resumed");
  std::filesystem::remove_all(first.out);
  first.stop_after = 20;
  training::train(first, progress, false);
  first.stop_after = 0;
  first.resume = true;
  training::train(first, progress, false);
  check_same_weights(o.out, first.out);
  std::filesystem::remove_all(o.out);
  std::filesystem::remove_all(first.out);
}
