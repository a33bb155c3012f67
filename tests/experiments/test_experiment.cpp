#include "tests/helpers.hpp"

#include <array>
#include <cstdlib>
#include <map>
#include <set>
#include <regex>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "qkv/experiments/experiment.hpp"
#include "qkv/sweep/sweep.hpp"
#include "qkv/training/options.hpp"
#include "qkv/report/charts.hpp"
#include "qkv/report/fourier.hpp"
#include "qkv/report/heatmap.hpp"  // escape_xml
#include "qkv/tasks/builtin.hpp"
#include "qkv/core/runtime.hpp"
#include "qkv/nn/files.hpp"
#include "tests/training/short_run.hpp"

using namespace qkv;
using namespace qkv::test;
using Catch::Matchers::Contains;
using Catch::Matchers::Equals;

namespace {

ExperimentOptions tiny(const std::string& name, const std::string& out, std::size_t seeds = 2) {
  return {.name = name, .quick = false, .seeds = seeds, .out = temp_folder("experiment_" + out), .steps = 4};
}

// The folder of the run of `labels` (its values joined by " / ") and `seed` in an experiment's results.
std::string run_folder(const ExperimentOptions& e, const std::string& labels, std::uint64_t seed) {
  const sweep::Sweep plan = sweep::parse_sweep(experiment_sweep(e), e.name);
  for (const sweep::Run& r : plan.runs)
    if (label_text(r.labels) == labels && r.seed == seed) return e.out + "/runs/" + r.id;
  FAIL("no run " << labels << ", seed " << seed);
  return "";
}

}  // namespace

TEST_CASE("experiment runner: the table, the JSON, ranges, and the same numbers from the same seeds") {
  std::ostringstream progress;
  const ExperimentOptions e = tiny("causal", "a");
  const ExperimentResult a = run_experiment(e, progress, false);

  // 2 attention kinds × 2 variants × 2 seeds.
  REQUIRE(a.runs.size() == 8);
  CHECK_THAT(progress.str(), Contains("[  8/8] brackets / bidirectional / tied, seed 1"));
  for (const auto& run : a.runs) {
    INFO(run.dump());
    for (const char* key : {"experiment", "task", "variant", "embeddings", "seed", "accuracy", "steps_to_target",
                            "seconds", "sigma_init", "sigma", "score_asymmetry_init", "score_asymmetry", "config"})
      CHECK(run.contains(key));
    CHECK(run.at("experiment") == "causal");
    CHECK(run.at("embeddings") == "learned");
    const double accuracy = run.at("accuracy"), sigma = run.at("sigma"), sigma_init = run.at("sigma_init");
    // Under the causal mask no pair of positions sees each other both ways: no asymmetry to measure.
    const bool causal = run.at("config").at("model").at("causal");
    CHECK(run.at("score_asymmetry").is_null() == causal);
    CHECK(run.at("score_asymmetry_init").is_null() == causal);
    const double asymmetry = causal ? 0.0 : run.at("score_asymmetry").get<double>();
    CHECK(accuracy >= 0);
    CHECK(accuracy <= 1);
    CHECK(sigma >= 0);
    CHECK(sigma <= 1 + 1e-12);
    CHECK(asymmetry >= 0);
    CHECK(asymmetry <= 2);
    CHECK(run.at("seconds").get<double>() > 0);
    CHECK((run.at("steps_to_target").is_null() || run.at("steps_to_target").get<std::size_t>() <= 4));
    CHECK(run.at("config").at("steps") == 4);
    CHECK(run.at("config").at("model").at("causal") == (run.at("labels").at("attention") == "causal"));
    // The curve: the init and the end (4 steps), measured while the run trained.
    const auto& curve = run.at("curve");
    REQUIRE(curve.size() == 2);
    CHECK(curve[0].at("step") == 0);
    CHECK(curve[1].at("step") == 4);
    CHECK(curve[1].at("accuracy") == run.at("accuracy"));  // the final evaluation's sequences
    CHECK(curve[0].at("sigma") == run.at("sigma_init"));
    CHECK(curve[1].at("score_asymmetry") == run.at("score_asymmetry"));
    CHECK(curve[0].at("accuracy") != curve[1].at("accuracy"));
    if (run.at("variant") == "tied") {
      CHECK(std::abs(sigma - 1) < 1e-12);
      CHECK(std::abs(sigma_init - 1) < 1e-12);
      CHECK(asymmetry < 1e-6);
    } else {
      CHECK(sigma < 0.9);
      if (!causal) CHECK(asymmetry > 0.1);
    }
  }
  // The markdown table: a header, a rule, one row per configuration.
  std::istringstream lines(a.table);
  std::vector<std::string> rows;
  for (std::string line; std::getline(lines, line);) rows.push_back(line);
  REQUIRE(rows.size() == 2 + 4);
  CHECK(rows[0] ==
        "| task | attention | variant | accuracy at step 4 | reached target | steps to target | σ init | σ | asymmetry init | "
        "asymmetry |");
  CHECK_THAT(rows[2], Contains("| - | - |"));  // causal: no asymmetry to measure
  CHECK_THAT(rows[2], Contains("| brackets | causal | untied | "));
  CHECK_THAT(rows[5], Contains("| brackets | bidirectional | tied | "));
  CHECK_THAT(rows[5], Contains(" ± "));  // two seeds
  CHECK_THAT(a.chart, Contains("<svg"));
  CHECK(std::filesystem::exists(e.out + "/results.json"));
  CHECK(std::filesystem::exists(e.out + "/causal.svg"));
  CHECK(std::filesystem::exists(e.out + "/causal-accuracy.svg"));
  CHECK(std::filesystem::exists(e.out + "/causal-score_asymmetry.svg"));
  REQUIRE(a.curves.size() == 2);
  CHECK(a.files == std::vector<std::string>{e.out + "/results.json", e.out + "/table.md", e.out + "/causal.svg",
                                            e.out + "/causal-accuracy.svg", e.out + "/causal-score_asymmetry.svg",
                                            e.out + "/results.jsonl", e.out + "/results.csv", e.out + "/summary.md"});
  CHECK(a.curves[0].first == "accuracy");
  std::ifstream in(e.out + "/results.json");
  const nlohmann::json file = nlohmann::json::parse(in);
  CHECK(file.at("runs").size() == 8);

  // Its results are not replaced without --force: refused before anything is written.
  const std::string results = nn::read_file(e.out + "/results.json", 1 << 24);
  ExperimentOptions rerun = e;
  rerun.seeds = 1;
  CHECK_THAT(error_message<UsageError>([&] { run_experiment(rerun, progress, false); }),
             Equals("--out " + e.out + ": holds an experiment's results already; give --force to replace them (or "
                    "--resume to go on with it)"));
  CHECK(nn::read_file(e.out + "/results.json", 1 << 24) == results);
  std::filesystem::remove(e.out + "/results.json");  // a run that died before it wrote results: its runs count too
  CHECK_THROWS_AS(run_experiment(rerun, progress, false), UsageError);

  // The same seeds again: every number but the time is the same.
  ExperimentOptions again = tiny("causal", "b");
  const ExperimentResult b = run_experiment(again, progress, false);

  // Stopped before it ended (a run's result lost, results.json not written): --resume runs that run
  // alone and writes the same results; another sweep's folder, or --resume with --force, is refused.
  {
    std::vector<std::string> kept;
    for (const auto& entry : std::filesystem::directory_iterator(again.out + "/results")) kept.push_back(entry.path().string());
    std::sort(kept.begin(), kept.end());
    REQUIRE(kept.size() == b.runs.size());
    const std::string other = nn::read_file(kept[1], 1 << 24);
    std::filesystem::remove(kept[0]);
    std::filesystem::remove(again.out + "/results.json");
    ExperimentOptions resumed = again;
    resumed.resume = true;
    std::ostringstream log;
    const ExperimentResult c = run_experiment(resumed, log, false);
    CHECK_THAT(log.str(), Contains("causal: 8 runs"));
    CHECK(nn::read_file(kept[1], 1 << 24) == other);  // the finished run was not run again
    REQUIRE(c.runs.size() == b.runs.size());
    for (std::size_t i = 0; i < b.runs.size(); ++i) CHECK(c.runs[i].at("curve") == b.runs[i].at("curve"));
    ExperimentOptions shorter = resumed;
    shorter.steps = 3;
    CHECK_THAT(error_message<UsageError>([&] { run_experiment(shorter, log, false); }),
               Contains("/sweep.json is another sweep than experiment causal's with these options"));
    resumed.force = true;
    CHECK_THAT(error_message<UsageError>([&] { run_experiment(resumed, log, false); }), Contains("give one"));
    ExperimentOptions empty = tiny("causal", "empty-resume");
    empty.resume = true;
    CHECK_THAT(error_message<UsageError>([&] { run_experiment(empty, log, false); }), Contains("holds no experiment to go on with"));
  }
  again.force = true;  // replaces b's results with the same numbers
  const ExperimentResult replaced = run_experiment(again, progress, false);
  REQUIRE(replaced.runs.size() == b.runs.size());
  for (std::size_t i = 0; i < b.runs.size(); ++i) CHECK(replaced.runs[i].at("curve") == b.runs[i].at("curve"));
  REQUIRE(b.runs.size() == a.runs.size());
  for (std::size_t i = 0; i < a.runs.size(); ++i)
    for (const char* key : {"accuracy", "steps_to_target", "sigma_init", "sigma", "score_asymmetry", "curve"})
      CHECK(a.runs[i].at(key) == b.runs[i].at(key));
  std::filesystem::remove_all(e.out);
  std::filesystem::remove_all(again.out);
}

TEST_CASE("experiment runner: the extra columns of scale and kv, and an unknown name") {
  std::ostringstream progress;
  const ExperimentOptions e = tiny("kv", "kv", 1);
  const ExperimentResult r = run_experiment(e, progress, false);
  REQUIRE(r.runs.size() == 3);
  // 2 layers × kv_heads × (d_head 8 + d_v 8) × 4 bytes per token.
  CHECK(r.runs[0].at("kv_cache_bytes_per_token") == 2 * 4 * 16 * 4);
  CHECK(r.runs[1].at("kv_cache_bytes_per_token") == 2 * 2 * 16 * 4);
  CHECK(r.runs[2].at("kv_cache_bytes_per_token") == 2 * 1 * 16 * 4);
  CHECK_THAT(r.table, Contains("| induction | MQA | "));
  std::filesystem::remove_all(e.out);

  const ExperimentOptions s = tiny("scale", "scale", 1);
  const ExperimentResult sr = run_experiment(s, progress, false);
  REQUIRE(sr.runs.size() == 6);
  for (const auto& run : sr.runs) {
    const double entropy = run.at("entropy_init"), top = run.at("max_weight_init"), grad = run.at("grad_norm_init");
    CHECK(entropy >= 0);
    CHECK(top > 0);
    CHECK(top <= 1);
    CHECK(grad > 0);
  }
  // Without 1/√d_head at d_head 64, scores at init are 8× larger: sharper rows, lower entropy.
  CHECK(sr.runs[5].at("entropy_init").get<double>() < sr.runs[4].at("entropy_init").get<double>());
  CHECK(sr.runs[5].at("max_weight_init").get<double>() > sr.runs[4].at("max_weight_init").get<double>());
  std::filesystem::remove_all(s.out);

  ExperimentOptions bad = tiny("sorting", "bad");
  CHECK_THAT(invalid_argument_message([&] { run_experiment(bad, progress, false); }),
             Contains("unknown experiment 'sorting' (known: ablations, dhead, scale, kv, causal, symmetry, length, masks, tokens, circuit, defaults, seq2seq, grokking)"));
}

TEST_CASE("experiment runner: on rps, symmetric and rank-1 scores put the beater on top for at most 2 of 3") {
  std::ostringstream progress;
  const ExperimentOptions e = tiny("ablations", "ablations", 1);
  const ExperimentResult r = run_experiment(e, progress, false);
  REQUIRE(r.runs.size() == 30);  // 3 tasks × 5 kinds of projection × 2 of embeddings
  std::size_t rps_runs = 0;
  for (const auto& run : r.runs) {
    INFO(run.at("labels").dump());
    if (run.at("task") != "rps") {
      CHECK_FALSE(run.contains("beater_top"));
      continue;
    }
    ++rps_runs;
    const double mean = run.at("beater_top"), max = run.at("beater_top_max");
    CHECK(mean >= 0);
    CHECK(mean <= max);
    CHECK(max <= 1);
    const std::string variant = run.at("variant");
    if (variant == "tied" || variant == "identity" || variant == "identity-qk") CHECK(max <= 2.0 / 3 + 1e-12);
  }
  CHECK(rps_runs == 10);
  CHECK(r.warnings.empty());
  CHECK_THAT(r.table, Contains("beater scored top (3 items) |"));
  std::filesystem::remove_all(e.out);

  const ExperimentOptions d = tiny("dhead", "dhead", 1);
  const ExperimentResult dr = run_experiment(d, progress, false);
  REQUIRE(dr.runs.size() == 8);
  for (const auto& run : dr.runs)
    if (run.at("task") == "rps" && run.at("config").at("model").at("d_head") == 1)
      CHECK(run.at("beater_top_max").get<double>() <= 2.0 / 3 + 1e-12);
  CHECK(dr.warnings.empty());
  std::filesystem::remove_all(d.out);
}

TEST_CASE("an experiment's grid of budgets gives way to --steps and --quick") {
  const std::string file = temp_folder("experiment_budgets") + ".json";
  std::ofstream(file) << R"({"tasks": ["rps"], "grid": {"qk": ["untied", "tied"], "steps": [10, 20]}, "seeds": {"count": 1}})";
  const sweep::Sweep both = sweep::parse_sweep(experiment_sweep({.name = file}), file);
  REQUIRE(both.runs.size() == 4);
  CHECK(both.runs[1].train.steps == 20);
  CHECK(both.runs[1].labels["steps"] == 20);
  for (const ExperimentOptions& o : {ExperimentOptions{.name = file, .steps = 5}, ExperimentOptions{.name = file, .quick = true}}) {
    const sweep::Sweep one = sweep::parse_sweep(experiment_sweep(o), file);
    REQUIRE(one.runs.size() == 2);
    for (const sweep::Run& r : one.runs) {
      CHECK(r.train.steps == (o.quick ? quick_steps : 5));
      CHECK(!r.labels.contains("steps"));
    }
  }
  // scale's own file, quick: its 6 configurations at one budget.
  CHECK(sweep::parse_sweep(experiment_sweep({.name = "scale", .quick = true}), "scale").runs.size() == 6);
  std::filesystem::remove(file);
}

TEST_CASE("the symmetry experiment's grid: five kinds of head on six tasks, every run valid") {
  const sweep::Sweep plan = sweep::parse_sweep(experiment_sweep({.name = "symmetry", .quick = true}), "symmetry");
  REQUIRE(plan.runs.size() == 30);
  std::map<std::string, int> per_task;
  for (const sweep::Run& r : plan.runs) {
    INFO(r.labels.dump());
    CHECK_NOTHROW(check_options(r.train));
    ++per_task[r.labels["task"].get<std::string>()];
    const std::string variant = r.labels["variant"];
    const bool identity = variant == "identity" || variant == "identity-qk";
    CHECK(nn::name_of(r.train.model.qk) == (identity ? std::string("untied") : variant));
    CHECK((r.train.model.proj == nn::Projection::identity) == (variant == "identity"));
    CHECK((r.train.model.proj == nn::Projection::identity_qk) == (variant == "identity-qk"));
    CHECK(r.train.steps == quick_steps);
    CHECK(r.train.warmup == quick_steps / 10 + 1);
    CHECK(r.train.target_every == 25);
  }
  CHECK(per_task == std::map<std::string, int>{{"brackets", 5}, {"rps", 5}, {"line", 5}, {"cycle n=3", 5},
                                               {"cycle n=5", 5}, {"induction", 5}});
  CHECK(plan.runs[15].train.n == 3);
  CHECK(plan.runs[20].train.n == 5);
  CHECK(plan.runs[20].train.model.vocab_size == 5);
}

TEST_CASE("each shipped experiment file plans the runs of its committed results, option for option") {
  // docs/experiments/NAME/results.json records each run's config.json: the file, run as shipped,
  // trains the same runs (but for the BLAS kernels and threads a machine has).
  const std::filesystem::path docs = std::filesystem::path(QKV_SOURCE_DIR) / "docs" / "experiments";
  for (const std::string& name : experiment_names()) {
    INFO(name);
    const sweep::Sweep plan = sweep::parse_sweep(experiment_sweep({.name = name}), name);
    std::multiset<std::string> planned, committed;
    const auto key = [](nlohmann::json config, std::uint64_t seed) {
      config.erase("blas"), config.erase("threads");
      return fmt::format("{} {}", seed, config.dump());
    };
    std::ifstream in(docs / name / "results.json");
    REQUIRE(in);
    const nlohmann::json results = nlohmann::json::parse(in);
    for (const auto& run : results.at("runs")) committed.insert(key(run.at("config"), run.at("seed")));
    for (const sweep::Run& r : plan.runs) {
      nlohmann::json config = nlohmann::json::parse(config_text(r.train)), recorded;
      // Only what the committed runs of its task record (a key added since is at its old default).
      const auto& runs = results.at("runs");
      const auto same_task = std::find_if(runs.begin(), runs.end(), [&](const nlohmann::json& c) { return c.at("task") == r.task; });
      REQUIRE(same_task != runs.end());
      const nlohmann::json& any = same_task->at("config");
      for (const auto& [k, v] : any.items())
        if (k != "model") recorded[k] = config.at(k);
      for (const auto& [k, v] : any.at("model").items()) recorded["model"][k] = config.at("model").at(k);
      if (!committed.count(key(recorded, r.seed))) UNSCOPED_INFO("not committed: " << key(recorded, r.seed));
      planned.insert(key(recorded, r.seed));
    }
    CHECK(planned.size() == results.at("runs").size());
    CHECK(planned == committed);
  }
}

TEST_CASE("experiment seeds: --seed-start picks the first seed, and a run's numbers depend on its seed alone") {
  std::ostringstream progress;
  ExperimentOptions two = tiny("kv", "seeds_two", 2), one = tiny("kv", "seeds_one", 1);
  two.seed_start = 2;  // seeds 2 and 3
  one.seed_start = 3;  // seed 3
  const ExperimentResult a = run_experiment(two, progress, false), b = run_experiment(one, progress, false);
  REQUIRE(a.runs.size() == 6);  // MHA, GQA, MQA × 2 seeds
  REQUIRE(b.runs.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(a.runs[i].at("seed") == 2);
    const auto& x = a.runs[3 + i];
    const auto& y = b.runs[i];
    CHECK(x.at("seed") == 3);
    CHECK(y.at("seed") == 3);
    for (const char* key : {"accuracy", "sigma_init", "sigma", "kv_cache_bytes_per_token"}) CHECK(x.at(key) == y.at(key));
  }
  std::filesystem::remove_all(two.out);
  std::filesystem::remove_all(one.out);
}

TEST_CASE("the length experiment: learned and sinusoidal positions, trained to 24, scored on 26-40 and 42-64") {
  std::ostringstream progress;
  const ExperimentOptions e = tiny("length", "length", 1);
  const ExperimentResult r = run_experiment(e, progress, false);
  REQUIRE(r.runs.size() == 2);
  CHECK(r.runs[0].at("config").at("model").at("positions") == "learned");
  CHECK(r.runs[1].at("config").at("model").at("positions") == "sinusoidal");
  for (std::size_t i = 0; i < 2; ++i) {
    const auto& run = r.runs[i];
    CHECK(run.at("config").at("model").at("max_len") == 65);  // BOS + 64
    // The same numbers again from the run's own folder: its model, on sequences of those lengths.
    const auto model = load_model(run_folder(e, fmt::format("brackets / {}", i ? "sinusoidal" : "learned"), 0));
    CHECK(run.at("accuracy_26-40") == evaluate(*model, BracketsTask(26, 40), 32, 32, 0x1e9).accuracy);
    CHECK(run.at("accuracy_42-64") == evaluate(*model, BracketsTask(42, 64), 32, 32, 0x1e9).accuracy);
    CHECK(run.at("accuracy_42-64") != run.at("accuracy_26-40"));
  }
  CHECK_THAT(r.table, Contains("| accuracy 26-40 | accuracy 42-64 |"));
  std::filesystem::remove_all(e.out);
}

TEST_CASE("an experiment's run trains the same weights as train alone: measuring along the way changes nothing") {
  std::ostringstream progress;
  const ExperimentOptions e = tiny("causal", "same_weights", 1);
  const ExperimentResult r = run_experiment(e, progress, false);
  REQUIRE(r.runs.size() == 4);
  // The bidirectional untied run: its curve ran the probe and the asymmetry's forwards.
  CHECK_FALSE(r.runs[2].at("score_asymmetry").is_null());
  const std::string folder = run_folder(e, "brackets / bidirectional / untied", 0);
  TrainOptions o = read_config(folder);
  o.out = temp_folder("experiment_same_weights_alone");
  o.force = true;
  train(o, progress, false);
  check_same_weights(folder, o.out);
  CHECK(r.runs[2].at("config").at("blas") == blas_kernels());  // the run's own config.json
  std::filesystem::remove_all(e.out);
  std::filesystem::remove_all(o.out);
}

TEST_CASE("curve steps: the init, then 1, 2, 3 and 5 per decade, and the end") {
  CHECK(sweep::curve_steps(6000) == std::vector<std::size_t>{0, 10, 20, 30, 50, 100, 200, 300, 500, 1000, 2000, 3000, 5000, 6000});
  CHECK(sweep::curve_steps(300) == std::vector<std::size_t>{0, 10, 20, 30, 50, 100, 200, 300});
  CHECK(sweep::curve_steps(1000) == std::vector<std::size_t>{0, 10, 20, 30, 50, 100, 200, 300, 500, 1000});
  CHECK(sweep::curve_steps(4) == std::vector<std::size_t>{0, 4});
  CHECK(sweep::curve_steps(1) == std::vector<std::size_t>{0, 1});
  CHECK(sweep::curve_steps(0) == std::vector<std::size_t>{0});
}

namespace {

// A run of `steps` steps with accuracy `mid` at step 1000 and `end` at the end.
nlohmann::ordered_json made_run(const std::string& variant, std::size_t seed, double mid, double end, std::size_t steps,
                                std::optional<std::size_t> reached) {
  nlohmann::ordered_json run = {{"task", "brackets"}, {"seed", seed}, {"labels", {{"task", "brackets"}, {"variant", variant}}},
                                {"accuracy", end}, {"steps", steps}, {"sigma_init", 0.5}, {"sigma", 0.25},
                                {"score_asymmetry_init", nullptr}, {"score_asymmetry", nullptr}};
  run["steps_to_target"] = reached ? nlohmann::ordered_json(*reached) : nlohmann::ordered_json(nullptr);
  run["curve"] = {{{"step", 0}, {"accuracy", 0.1}}, {{"step", 1000}, {"accuracy", mid}}, {{"step", steps}, {"accuracy", end}}};
  return run;
}

}  // namespace

TEST_CASE("experiment table: accuracy at step 1000 and at the end, mean and sample std over seeds") {
  nlohmann::ordered_json runs = nlohmann::ordered_json::array();
  runs.push_back(made_run("untied", 0, 0.5, 0.9, 6000, 700));
  runs.push_back(made_run("untied", 1, 0.7, 1.0, 6000, 900));
  runs.push_back(made_run("tied", 0, 0.2, 0.6, 6000, std::nullopt));
  const std::string table = experiment_table("causal", runs);
  std::istringstream lines(table);
  std::vector<std::string> rows;
  for (std::string line; std::getline(lines, line);) rows.push_back(line);
  REQUIRE(rows.size() == 4);
  CHECK(rows[0] == "| task | variant | accuracy at step 1000 | accuracy at step 6000 | reached target | steps to target | "
                   "σ init | σ | asymmetry init | asymmetry |");
  // 0.5, 0.7: mean 0.6, std √0.02 = 0.141, and the bootstrap means of two values are 0.5, 0.6 or
  // 0.7 (1/4, 1/2, 1/4): the 2.5th and 97.5th percentiles are 0.5 and 0.7. 0.9, 1.0: 0.95 ± 0.071
  // (0.90–1.00). 700, 900 reached: 2 of 2, Wilson 34–100%, median 800. Equal σ: no interval.
  CHECK(rows[2] == "| brackets | untied | 0.600 ± 0.141 (0.500–0.700) | 0.950 ± 0.071 (0.900–1.000) | 2 of 2 (34–100%) | "
                   "800 (700–900) | 0.500 ± 0.000 | 0.250 ± 0.000 | - | - |");
  CHECK(rows[3] == "| brackets | tied | 0.200 | 0.600 | 0 of 1 (0–79%) | - | 0.500 | 0.250 | - | - |");
  // Runs that stop at the short budget have one accuracy column.
  nlohmann::ordered_json short_runs = nlohmann::ordered_json::array();
  short_runs.push_back(made_run("untied", 0, 0.5, 0.9, 1000, 700));
  CHECK_THAT(experiment_table("causal", short_runs), Contains("| variant | accuracy at step 1000 | reached target |"));
  // Runs of different budgets: one column, at each run's end.
  short_runs.push_back(made_run("tied", 0, 0.5, 0.7, 6000, std::nullopt));
  CHECK_THAT(experiment_table("causal", short_runs), Contains("| variant | accuracy at the end | reached target |"));
}

TEST_CASE("steps chart: values past 10 on round lines, and the last step labelled where its label fits") {
  using report::ChartLine;
  // A weight norm from 1,780 up to 3,620 over 40,000 steps: lines at 0, 1000, … 4000.
  const ChartLine norm{"", "weight norm", {{0, {1780}}, {200, {3620}}, {40000, {1250}}}};
  const std::string one = report::steps_chart("weight norm", "", {norm}, false);
  for (const char* label : {">0<", ">1000<", ">2000<", ">3000<", ">4000<"}) CHECK_THAT(one, Contains(label));
  CHECK_THAT(one, !Contains("e+03") && !Contains(">5000<"));
  // Steps: 0, 10, … 10000, and 40000 on a panel 564 wide (74 px past 10000); not on two panels
  // 244 wide, where 40000 would stand 32 px from 10000, closer than the two labels' half-widths.
  CHECK_THAT(one, Contains(">10000</text>") && Contains(">40000</text>"));
  ChartLine other = norm;
  other.panel = "b";
  ChartLine first = norm;
  first.panel = "a";
  const std::string two = report::steps_chart("weight norm", "", {first, other}, true);
  CHECK_THAT(two, Contains(">10000</text>") && !Contains(">40000</text>"));
  // From below 0: the axis starts at a multiple of the step too, −500 under values of −20 to 1,800.
  const std::string below = report::steps_chart("", "", {ChartLine{"", "x", {{0, {-20}}, {100, {1800}}}}}, false);
  CHECK_THAT(below, Contains(">-500<") && Contains(">2000<") && !Contains(">-20<"));
}

TEST_CASE("curves chart: a panel per task, a line per configuration through the mean of its seeds") {
  nlohmann::ordered_json runs = nlohmann::ordered_json::array();
  runs.push_back(made_run("untied", 0, 0.5, 0.9, 6000, 700));
  runs.push_back(made_run("untied", 1, 0.7, 1.0, 6000, 900));
  runs.push_back(made_run("tied", 0, 0.2, 0.6, 6000, std::nullopt));
  const std::string svg = curves_chart("causal", runs, "accuracy", "held-out accuracy");
  CHECK_THAT(svg, Contains("<title>brackets / untied</title>"));
  CHECK_THAT(svg, Contains("<title>brackets / tied</title>"));
  CHECK_THAT(svg, Contains("mean over 2 seed(s)"));
  // One panel: the plot is 620 - 44 - 12 = 564 wide and 260 - 22 - 34 = 204 high, from (44, 72);
  // step s at x = 44 + 564 log10(s + 1) / log10(6001), accuracy a at y = 72 + 204 (1 - a).
  const auto point = [](std::size_t step, double a) {
    return fmt::format("{:.1f},{:.1f}", 44 + 564 * std::log10(double(step) + 1) / std::log10(6001.0), 72 + 204 * (1 - a));
  };
  CHECK_THAT(svg, Contains(fmt::format("points=\"{} {} {} \"", point(0, 0.1), point(1000, 0.6), point(6000, 0.95))));
  CHECK(std::count(svg.begin(), svg.end(), '\n') > 10);
  std::size_t polylines = 0;
  for (std::size_t at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1)) ++polylines;
  CHECK(polylines == 2);
  // No run has an asymmetry: no chart.
  CHECK(curves_chart("causal", runs, "score_asymmetry", "asymmetry").empty());
}

TEST_CASE("steps chart: each panel's legend sits under that panel, naming only the series it draws") {
  // σ of two heads, one composition score, one probe: L1H0 is σ's, not the composition's.
  std::vector<ChartLine> lines;
  for (const char* head : {"L0H0", "L1H0"}) lines.push_back({.panel = "σ", .series = head, .values = {{0, {0.5}}, {10, {0.6}}}});
  lines.push_back({.panel = "composition", .series = "L0H0→L1H0 K", .values = {{0, {0.2}}, {10, {0.3}}}});
  lines.push_back({.panel = "probes", .series = "copy", .values = {{0, {0.1}}, {10, {0.9}}}});
  const std::string svg = steps_chart("the heads along training", "snapshots.jsonl", lines, false);
  // The panels' frames (left, right, bottom) and the legend's entries, by their text's left end.
  std::vector<std::array<double, 3>> frames;
  const std::regex frame(R"re(<rect x="([0-9.]+)" y="([0-9.]+)" width="([0-9.]+)" height="([0-9.]+)" fill="none" stroke="#999"/>)re");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), frame); it != std::sregex_iterator(); ++it)
    frames.push_back({std::stod((*it)[1]), std::stod((*it)[1]) + std::stod((*it)[3]), std::stod((*it)[2]) + std::stod((*it)[4])});
  REQUIRE(frames.size() == 3);
  for (std::size_t p = 0; p < 3; ++p)
    for (const ChartLine& line : lines) {
      const std::size_t at = svg.find(fmt::format(">{}</text>", escape_xml(line.series)));
      REQUIRE(at != std::string::npos);
      const std::string entry = svg.substr(svg.rfind("<text", at), at - svg.rfind("<text", at));
      std::smatch m;
      REQUIRE(std::regex_search(entry, m, std::regex(R"re(x="([0-9.]+)" y="([0-9.]+)")re")));
      const double x = std::stod(m[1]), y = std::stod(m[2]);
      const bool under = x >= frames[p][0] - 40 && x < frames[p][1] && y > frames[p][2];
      const std::size_t panel = line.panel == "σ" ? 0 : line.panel == "composition" ? 1 : 2;
      INFO(line.series << " at (" << x << ", " << y << "), panel " << p);
      CHECK(under == (panel == p));
    }
}

TEST_CASE("steps chart: a value below 0 is drawn below the 0 line, inside its panel, on an axis from the next half below") {
  // A share that goes the other way (-0.6) and one up to 0.4: the axis runs from -1 to 1.
  const std::vector<ChartLine> lines = {{.panel = "share", .series = "L0H0", .values = {{0, {-0.6}}, {10, {0.4}}}}};
  const std::string svg = steps_chart("t", "s", lines, false);
  std::smatch m;
  REQUIRE(std::regex_search(svg, m, std::regex(R"re(<rect x="([0-9.]+)" y="([0-9.]+)" width="([0-9.]+)" height="([0-9.]+)" fill="none")re")));
  const double top = std::stod(m[2]), bottom = top + std::stod(m[4]);
  REQUIRE(std::regex_search(svg, m, std::regex(R"re(<polyline points="[0-9.]+,([0-9.]+) [0-9.]+,([0-9.]+) ")re")));
  const double at_minus = std::stod(m[1]), at_plus = std::stod(m[2]);
  // y of v: top + height · (1 − (v + 1) / 2).
  CHECK(at_minus == Approx(top + (bottom - top) * 0.8).margin(0.1));
  CHECK(at_plus == Approx(top + (bottom - top) * 0.3).margin(0.1));
  CHECK_THAT(svg, Contains(">-1</text>") && Contains(">-0.5</text>") && Contains(">0</text>") && Contains(">1</text>"));
}

TEST_CASE("steps chart on a log axis: whole decades around the values, each drawn at its logarithm, 0 left out") {
  // Losses from 0.002 to 30 (and a 0, which no log axis holds): the axis runs 1e-3 to 1e2.
  const std::vector<ChartLine> lines = {
      {.panel = "loss", .series = "held out", .values = {{0, {30}}, {10, {0.002}}, {100, {0}}, {1000, {1}}}}};
  const std::string svg = steps_chart("t", "s", lines, false, true);
  std::smatch m;
  REQUIRE(std::regex_search(svg, m, std::regex(R"re(<rect x="([0-9.]+)" y="([0-9.]+)" width="([0-9.]+)" height="([0-9.]+)" fill="none")re")));
  const double top = std::stod(m[2]), height = std::stod(m[4]);
  REQUIRE(std::regex_search(svg, m, std::regex(R"re(<polyline points="[0-9.]+,([0-9.]+) [0-9.]+,([0-9.]+) [0-9.]+,([0-9.]+) ")re")));
  // y of v: top + height · (2 − log10 v) / 5; the 0 at step 100 is not a point of the line.
  CHECK(std::stod(m[1]) == Approx(top + height * (2 - std::log10(30.0)) / 5).margin(0.1));
  CHECK(std::stod(m[2]) == Approx(top + height * (2 - std::log10(0.002)) / 5).margin(0.1));
  CHECK(std::stod(m[3]) == Approx(top + height * 2 / 5).margin(0.1));
  CHECK_THAT(svg, Contains(">1e-3</text>") && Contains(">1</text>") && Contains(">1e2</text>"));
  CHECK_THAT(svg, !Contains(">1e3</text>") && !Contains(">1e-4</text>"));
}

TEST_CASE("the docs' experiment tables and charts are those of the committed results") {
  // docs/experiments/NAME/results.json holds every run of a full run; table.md beside it and the
  // table in docs/experiments.md must be what the runner makes of those runs.
  const std::filesystem::path docs = std::filesystem::path(QKV_SOURCE_DIR) / "docs";
  std::ifstream page_in(docs / "experiments.md");
  REQUIRE(page_in);
  std::string page((std::istreambuf_iterator<char>(page_in)), std::istreambuf_iterator<char>());
  const char* write_docs = std::getenv("QKV_WRITE_DOCS");
  const bool write = write_docs && std::string(write_docs) == "1";
  for (const std::string& name : experiment_names()) {
    INFO(name);
    std::ifstream in(docs / "experiments" / name / "results.json");
    REQUIRE(in);
    const nlohmann::ordered_json results = nlohmann::ordered_json::parse(in);
    CHECK(results.at("experiment") == name);
    CHECK(results.at("quick") == false);
    const nlohmann::ordered_json file = nlohmann::ordered_json::parse(experiment_file(name));
    CHECK(results.at("seeds") == file.at("seeds").at("count"));
    const sweep::Sweep plan = sweep::parse_sweep(file, name);
    CHECK(results.at("steps") == plan.runs.at(0).train.steps);
    CHECK(results.at("runs").size() == plan.runs.size());
    for (const auto& run : results.at("runs")) CHECK(run.at("curve").back().at("accuracy") == run.at("accuracy"));
    // The table and the charts, as the runner makes them of the committed runs; with
    // QKV_WRITE_DOCS=1 in the environment, written where they differ (a label renamed, say).
    const std::string table = experiment_table(name, results.at("runs"));
    const auto [chart, curves] = experiment_charts(name, results.at("runs"));
    std::vector<std::pair<std::string, std::string>> files = {{"table.md", table}, {name + ".svg", chart}};
    for (const auto& [key, svg] : curves) files.emplace_back(fmt::format("{}-{}.svg", name, key), svg);
    for (const auto& [file, made] : files) {
      INFO(file);
      const std::filesystem::path path = docs / "experiments" / name / file;
      std::ifstream file_in(path);
      const std::string committed((std::istreambuf_iterator<char>(file_in)), std::istreambuf_iterator<char>());
      CHECK(committed == made);
      if (write && committed != made) nn::write_atomically(path.string(), made);
    }
    CHECK(page.find(table) != std::string::npos);
    // Written, the page's table is the one under the section's `build/qkv experiment NAME` block:
    // its lines from the first that starts with "| " to the blank line after them.
    if (write && page.find(table) == std::string::npos) {
      const std::size_t section = page.find("build/qkv experiment " + name + "\n```");
      REQUIRE(section != std::string::npos);
      const std::size_t start = page.find("\n| ", section) + 1, end = page.find("\n\n", start) + 1;
      REQUIRE((start > 0 && end > start));
      page.replace(start, end - start, table);
    }
  }
  if (write) nn::write_atomically((docs / "experiments.md").string(), page);
}

TEST_CASE("the README's table of what tying breaks is the symmetry experiment's accuracy at step 6000") {
  // Each row `task`, then a cell per kind of head (untied, tied, symmetric, identity, identity-qk): the mean ±
  // sd over seeds of the committed results' final accuracy, as the experiment's table prints it.
  const std::filesystem::path root(QKV_SOURCE_DIR);
  std::ifstream in(root / "docs" / "experiments" / "symmetry" / "results.json");
  REQUIRE(in);
  const nlohmann::ordered_json results = nlohmann::ordered_json::parse(in);
  std::map<std::pair<std::string, std::string>, std::string> cell;  // (task label, variant) → "mean ± sd"
  for (const report::RunGroup& g : report::group_runs(results.at("runs"))) {
    const report::Stats s = report::stats(report::run_values(g, "accuracy"));
    cell[{g.labels.at("task"), g.labels.at("variant")}] = fmt::format("{:.3f} ± {:.3f}", s.mean, s.sd);
  }
  std::ifstream readme_in(root / "README.md");
  REQUIRE(readme_in);
  const std::regex row(R"(^\| `([a-z]+)( --n ([0-9]+))?` \| [^|]+ \| ([^|]+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$)");
  std::size_t rows = 0;
  for (std::string line; std::getline(readme_in, line);) {
    std::smatch m;
    if (!std::regex_match(line, m, row)) continue;
    const std::string task = m[3].matched ? fmt::format("{} n={}", m[1].str(), m[3].str()) : m[1].str();
    INFO(line);
    std::size_t column = 4;
    for (const char* variant : {"untied", "tied", "symmetric", "identity", "identity-qk"}) {
      REQUIRE(cell.count({task, variant}));
      CHECK(m[column++].str() == cell.at({task, variant}));
    }
    ++rows;
  }
  CHECK(rows == 5);
}

TEST_CASE("an experiment on two processes gives the results of one, bit for bit but the seconds") {
  std::ostringstream progress;
  ExperimentOptions one = tiny("kv", "one_process"), two = tiny("kv", "two_processes");
  two.jobs = 2;
  const ExperimentResult a = run_experiment(one, progress, false), b = run_experiment(two, progress, false);
  REQUIRE(a.runs.size() == 6);
  REQUIRE(b.runs.size() == 6);
  for (std::size_t i = 0; i < 6; ++i) {
    nlohmann::ordered_json x = a.runs[i], y = b.runs[i];
    x.erase("seconds"), y.erase("seconds");
    x["config"].erase("out"), y["config"].erase("out");
    CHECK(x.dump() == y.dump());
  }
  CHECK(a.table == b.table);
}

TEST_CASE("the grokking section's figures are seed 0's progress measures in the committed results") {
  // docs/experiments/grokking/seed0-fourier-*.svg: seed 0's run (weight decay 1) as `qkv inspect DIR
  // --fourier --svg` draws it, from what the grokking measurement keeps of each kept step in
  // results.json (every number the figures read). With QKV_WRITE_DOCS=1, written where they differ.
  const std::filesystem::path dir = std::filesystem::path(QKV_SOURCE_DIR) / "docs" / "experiments" / "grokking";
  std::ifstream in(dir / "results.json");
  REQUIRE(in);
  const nlohmann::json results = nlohmann::json::parse(in);
  const nlohmann::json* seed0 = nullptr;
  for (const auto& run : results.at("runs"))
    if (run.at("seed") == 0 && run.at("labels").at("decay") == "1") seed0 = &run;
  REQUIRE(seed0);
  const nlohmann::json& g = seed0->at("grokking");
  analysis::FourierRun r;
  r.dir = "grokking, seed 0 (weight decay 1)";
  r.final.p = seed0->at("config").at("n").get<std::size_t>();  // modadd's size, p
  r.final.key_frequencies = g.at("key_frequencies").get<std::vector<std::size_t>>();
  for (const auto& point : g.at("along")) {
    analysis::FourierAnalysis a;
    a.train_loss = point.at("train_loss"), a.test_loss = point.at("test_loss");
    a.restricted_loss = point.at("restricted_loss"), a.excluded_loss = point.at("excluded_loss");
    a.weight_norm = point.at("weight_norm");
    a.embed = point.at("embed").get<std::vector<double>>();
    r.steps.push_back(point.at("step").get<std::size_t>());
    r.along.push_back(std::move(a));
  }
  const auto charts = report::fourier_charts(r);
  REQUIRE(charts.size() == 4);
  const char* write_docs = std::getenv("QKV_WRITE_DOCS");
  for (const auto& [name, svg] : charts) {
    INFO(name);
    const std::filesystem::path path = dir / ("seed0-" + name + ".svg");
    std::ifstream file_in(path);
    const std::string committed((std::istreambuf_iterator<char>(file_in)), std::istreambuf_iterator<char>());
    CHECK(committed == svg);
    if (write_docs && std::string(write_docs) == "1" && committed != svg) nn::write_atomically(path.string(), svg);
  }
}
