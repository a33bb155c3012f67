// The Fourier analysis of modular addition: the basis, each function's frequency, and the model's
// norms, restricted and excluded losses against sums written out here.
#include "tests/training/short_run.hpp"  // Catch2, after xarray.hpp

#include <cmath>
#include <numbers>
#include <set>

#include <xtensor-blas/xlinalg.hpp>
#include <xtensor/xmath.hpp>

#include "qkv/analysis/fourier.hpp"
#include "qkv/report/fourier.hpp"
#include "qkv/training/run_analysis.hpp"

using namespace qkv;
using namespace qkv::test;
using Catch::Matchers::Contains;

namespace {

// Mean cross-entropy of rows of logits (p², C) against (a + b) mod p.
double loss_on(const Array<double>& logits, const std::vector<std::size_t>& rows, std::size_t p) {
  double total = 0;
  for (std::size_t r : rows) {
    const auto row = xt::view(logits, r, xt::all());
    total += std::log(xt::sum(xt::exp(row))()) - row((r / p + r % p) % p);
  }
  return total / double(rows.size());
}

}  // namespace

TEST_CASE("the Fourier basis of Z_p is orthonormal, named by frequency, for odd and even p") {
  for (const std::size_t p : {7, 8, 113}) {
    INFO(p);
    const Array<double> F = analysis::fourier_basis(p);
    check_close(xt::linalg::dot(F, xt::transpose(F)), xt::eye<double>(p), 1e-12);
    const auto names = analysis::fourier_basis_names(p);
    CHECK(names[0] == "const");
    CHECK(names[1] == "cos 1");
    CHECK(names[2] == "sin 1");
    CHECK(analysis::frequency_count(p) == p / 2 + 1);
    // Row cos k is cos(2πkx/p) scaled to norm 1: √(2/p) at x = 0.
    CHECK(F(5, 0) == Approx(std::sqrt(2.0 / double(p))));
    CHECK(F(5, 1) == Approx(std::sqrt(2.0 / double(p)) * std::cos(2 * std::numbers::pi * 3 / double(p))));
  }
  CHECK(analysis::fourier_basis_names(8)[7] == "cos 4");  // the alternating row, alone
  CHECK(analysis::frequency_rows(8, 4) == std::vector<std::size_t>{7});
  CHECK(analysis::frequency_rows(7, 3) == std::vector<std::size_t>{5, 6});
  CHECK_THROWS_WITH(analysis::frequency_rows(7, 4), "frequency_rows: frequency 4 of Z_7: the frequencies are 0 to 3");
}

TEST_CASE("each function's best frequency holds the share of its variance its terms hold") {
  const std::size_t p = 11;
  const double w = 2 * std::numbers::pi / double(p);
  Array<double> f = xt::zeros<double>({p, p, std::size_t(4)});
  for (std::size_t a = 0; a < p; ++a)
    for (std::size_t b = 0; b < p; ++b) {
      f(a, b, 0) = std::cos(w * 3 * double(a + b));                           // cos a cos b − sin a sin b: all frequency 3
      f(a, b, 1) = 2 * std::cos(w * 2 * double(a)) + std::cos(w * 5 * double(b)) + 7;  // 4 : 1 of the variance
      f(a, b, 2) = std::sin(w * 4 * double(a)) * std::cos(w * 4 * double(b));   // a product: frequency 4's terms
      f(a, b, 3) = 1.5;                                                        // constant: no variance
    }
  const auto found = analysis::best_frequencies(f);
  REQUIRE(found.size() == 4);
  CHECK(found[0].frequency == 3);
  CHECK(found[0].share == Approx(1.0).epsilon(1e-12));
  CHECK(found[1].frequency == 2);
  CHECK(found[1].share == Approx(0.8).epsilon(1e-12));
  CHECK(found[2].frequency == 4);
  CHECK(found[2].share == Approx(1.0).epsilon(1e-12));
  CHECK(found[3].share == 0.0);
  CHECK_THROWS_WITH(analysis::best_frequencies(xt::zeros<double>({3, 4, 1})), Contains("expected (p, p, n)"));
}

TEST_CASE("a modadd model's norms by frequency, restricted and excluded losses equal their sums by hand") {
  const std::size_t p = 7;
  tasks::TrainOptions o = tasks::default_options("modadd", p);
  o.model.d_model = 8;
  o.model.heads = 2;
  o.model.d_mlp = 16;
  o.model.dtype = DType::float64;
  const auto task = tasks::make_task(o);
  const auto& modadd = dynamic_cast<const tasks::ModAddTask&>(*task);
  Generator gen(2);
  nn::Transformer model(o.model, gen);

  std::vector<std::size_t> all_keys;
  for (std::size_t k = 1; k <= p / 2; ++k) all_keys.push_back(k);
  // No key frequency, given: restricted to the mean alone, nothing excluded.
  const analysis::FourierAnalysis none =
      analysis::fourier_analysis(model, modadd, {.key_frequencies = std::vector<std::size_t>{}});
  CHECK(none.key_frequencies.empty());
  // Found, as the paper finds them: each neuron's best frequency, once.
  const analysis::FourierAnalysis found = analysis::fourier_analysis(model, modadd);
  std::set<std::size_t> best;
  for (const analysis::FrequencyShare& n : found.neurons)
    if (n.share > 0) best.insert(n.frequency);
  CHECK(found.key_frequencies == std::vector<std::size_t>(best.begin(), best.end()));
  CHECK(found.found == found.key_frequencies);
  CHECK_FALSE(found.found.empty());
  const analysis::FourierAnalysis every = analysis::fourier_analysis(model, modadd, {.key_frequencies = all_keys});
  CHECK(every.key_frequencies == all_keys);
  CHECK(every.neurons.size() == 16);
  REQUIRE(every.heads.size() == 1);
  CHECK(every.heads[0].size() == 2);

  // The logits at "=" of every pair, row a · p + b.
  IndexArray tokens = tasks::filled(p * p, 3, std::int64_t(p));
  for (std::size_t i = 0; i < p * p; ++i) tokens(i, 0) = std::int64_t(i / p), tokens(i, 1) = std::int64_t(i % p);
  const Array<double> out = model.forward(tokens).logits.value<double>();
  const Array<double> logits = xt::view(out, xt::all(), 2, xt::range(0, p));  // the answers' logits, not "="'s
  std::vector<std::size_t> all(p * p), train;
  for (std::size_t i = 0; i < p * p; ++i) all[i] = i;
  for (std::size_t i = 0; i < modadd.split()->train.tokens.shape()[0]; ++i)
    train.push_back(std::size_t(modadd.split()->train.tokens(i, 0)) * p + std::size_t(modadd.split()->train.tokens(i, 1)));
  CHECK(every.train_loss == Approx(loss_on(logits, train, p)).epsilon(1e-12));

  // Every frequency kept: the logits projected onto functions of a + b, each row the mean of the
  // rows with its sum. Excluded: the logits less that, plus their mean.
  Array<double> by_sum = xt::zeros<double>({p, logits.shape()[1]});
  for (std::size_t i = 0; i < p * p; ++i) xt::view(by_sum, (i / p + i % p) % p, xt::all()) += xt::view(logits, i, xt::all()) / double(p);
  const Array<double> mean = xt::mean(logits, {0});
  Array<double> restricted = logits, excluded = logits;
  for (std::size_t i = 0; i < p * p; ++i) {
    xt::view(restricted, i, xt::all()) = xt::view(by_sum, (i / p + i % p) % p, xt::all());
    xt::view(excluded, i, xt::all()) = xt::view(logits, i, xt::all()) - xt::view(by_sum, (i / p + i % p) % p, xt::all()) + mean;
  }
  CHECK(every.restricted_loss == Approx(loss_on(restricted, all, p)).epsilon(1e-12));
  CHECK(every.excluded_loss == Approx(loss_on(excluded, train, p)).epsilon(1e-12));
  // No key frequency: restricted to the mean alone, and nothing excluded.
  Array<double> means = logits;
  for (std::size_t i = 0; i < p * p; ++i) xt::view(means, i, xt::all()) = mean;
  CHECK(none.restricted_loss == Approx(loss_on(means, all, p)).epsilon(1e-12));
  CHECK(none.excluded_loss == Approx(none.train_loss).epsilon(1e-12));

  // The embedding's norm along frequency 2: √(Σ_d (Σ_x cos(2·2πx/p) W[x, d])² + (… sin …)²) · √(2/p).
  const Array<double>& W = model.tok.weight.value<double>();
  double cos2 = 0, sin2 = 0;
  for (std::size_t d = 0; d < 8; ++d) {
    double c = 0, s = 0;
    for (std::size_t x = 0; x < p; ++x) {
      c += std::cos(2 * std::numbers::pi * 2 * double(x) / double(p)) * W(x, d);
      s += std::sin(2 * std::numbers::pi * 2 * double(x) / double(p)) * W(x, d);
    }
    cos2 += c * c, sin2 += s * s;
  }
  CHECK(every.embed[2] == Approx(std::sqrt((cos2 + sin2) * 2 / double(p))).epsilon(1e-12));
  // Parseval: the norms hold the rows of the numbers (not "=") whole.
  double total = 0;
  for (double n : every.embed) total += n * n;
  CHECK(total == Approx(xt::sum(xt::square(xt::view(W, xt::range(0, p), xt::all())))()).epsilon(1e-12));
  double squares = 0;
  for (const Tensor& t : model.parameters()) squares += xt::sum(xt::square(t.value<double>()))();
  CHECK(every.weight_norm == Approx(squares).epsilon(1e-12));

  CHECK_THROWS_WITH(analysis::fourier_analysis(model, modadd, {.key_frequencies = std::vector<std::size_t>{4}}),
                    "fourier_analysis: key frequency 4: the frequencies of Z_7 are 1 to 3");
  o.model.vocab_size = o.model.n_classes = 9;
  nn::Transformer other(o.model, gen);
  CHECK_THROWS_WITH(analysis::fourier_analysis(other, modadd), Contains("does not read modadd's p = 7"));
  // p = 1000 with an MLP 100,000 wide: its million inputs' activations alone are 800 GB. Refused
  // before they are made.
  const tasks::ModAddTask large(1000, 0.3, 0);
  const nn::TransformerConfig wide{.vocab_size = 1001, .n_classes = 1001, .max_len = 3, .layers = 1, .d_model = 8,
                                   .heads = 2, .mlp = true, .d_mlp = 100'000};
  nn::Transformer huge(wide, gen);
  CHECK_THROWS_WITH(analysis::fourier_analysis(huge, large),
                    Contains("fourier_analysis: p = 1000: reading all 1000000 pairs at once needs about"));
}

TEST_CASE("fourier_run analyses a modadd run and each checkpoint it kept, and refuses another task's run") {
  tasks::TrainOptions o = short_run("modadd", "fourier", 20);
  o.n = 11;
  o.model.vocab_size = o.model.n_classes = 12;
  o.model.d_model = 16;
  o.model.d_mlp = 32;
  o.keep_checkpoints = "every:10";
  std::ostringstream progress;
  training::train(o, progress, false);
  const analysis::FourierRun r = training::fourier_run(o.out);
  CHECK(r.steps == std::vector<std::size_t>{0, 10, 20});
  REQUIRE(r.along.size() == 3);
  // The last kept checkpoint is the final model, measured with its key frequencies.
  CHECK(r.along.back().train_loss == r.final.train_loss);
  CHECK(r.along.back().restricted_loss == r.final.restricted_loss);
  for (const analysis::FourierAnalysis& a : r.along) CHECK(a.key_frequencies == r.final.key_frequencies);
  const nlohmann::json j = report::to_json(r);
  CHECK(j.at("along").size() == 3);
  CHECK(j.at("final").at("embed").size() == 6);
  std::ostringstream text;
  report::print_fourier(text, r);
  CHECK_THAT(text.str(), Contains("modular addition, p = 11"));
  const auto charts = report::fourier_charts(r);
  REQUIRE(charts.size() >= 3);
  CHECK(charts[0].first == "fourier-loss");
  CHECK(charts[1].first == "fourier-progress");
  CHECK(charts[2].first == "fourier-weight-norm");
  CHECK_THAT(charts[1].second, Contains("restricted (all pairs)") && Contains("excluded (training pairs)"));
  CHECK(charts.size() == (r.final.key_frequencies.empty() ? 3u : 4u));

  tasks::TrainOptions b = short_run("brackets", "fourier_brackets", 5);
  training::train(b, progress, false);
  CHECK_THROWS_WITH(training::fourier_run(b.out), Contains("a brackets run: the Fourier analysis reads a model of modular addition"));
  std::filesystem::remove_all(o.out);
  std::filesystem::remove_all(b.out);
}

TEST_CASE("grokking reads the steps of its log and of its progress measures, on series made by hand") {
  analysis::FourierRun run;
  run.steps = {0, 10, 100, 1000, 5000, 10000};
  // restricted falls 4 → 0 (past half-way, 2, from 5000 on); excluded rises 0 → 10 (past 5 from 10000);
  // the weight norm rises to its peak at 1000 and falls to 100 (past 550 from 5000 on).
  const std::vector<double> restricted = {4, 4, 3.9, 2.5, 1.0, 0.01}, excluded = {0, 0.1, 0.1, 1, 4, 10},
                            norm = {1000, 1100, 1500, 2000, 500, 100};
  for (std::size_t i = 0; i < run.steps.size(); ++i) {
    analysis::FourierAnalysis a;
    a.restricted_loss = restricted[i], a.excluded_loss = excluded[i], a.weight_norm = norm[i];
    run.along.push_back(a);
  }
  std::vector<analysis::TrainingHistory::Logged> log;
  for (std::size_t step = 100; step <= 1000; step += 100) {
    analysis::TrainingHistory::Logged line{.step = step, .loss = 1, .accuracy = step >= 300 ? 0.995 : 0.5};
    line.test_accuracy = step >= 800 ? 0.991 : step == 500 ? 0.985 : 0.1;
    log.push_back(line);
  }
  const analysis::Grokking g = analysis::grokking(run, log);
  CHECK(g.train_99 == std::optional<std::size_t>(300));
  CHECK(g.test_99 == std::optional<std::size_t>(800));
  CHECK(g.restricted == std::optional<std::size_t>(5000));
  CHECK(g.excluded == std::optional<std::size_t>(10000));
  CHECK(g.weight_norm_peak == std::optional<std::size_t>(1000));
  CHECK(g.weight_norm_fall == std::optional<std::size_t>(5000));
  // A run that never gets there: none.
  for (auto& line : log) line.test_accuracy = 0.5;
  CHECK_FALSE(analysis::grokking(run, log).test_99);
}
