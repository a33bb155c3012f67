#include "tests/helpers.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "qkv/analysis/alignment.hpp"
#include "qkv/nn/files.hpp"
#include "qkv/sweep/measure.hpp"
#include "qkv/sweep/sweep.hpp"
#include "qkv/tasks/evaluate.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/training/run_folder.hpp"
#include "qkv/training/trainer.hpp"

using namespace qkv;
using namespace qkv::test;
using namespace qkv::sweep;
using Catch::Matchers::Contains;
using Json = nlohmann::ordered_json;

namespace {

Sweep parsed(const std::string& text) { return parse_sweep(Json::parse(text), "s.json"); }

std::string refusal(const std::string& text) {
  return invalid_argument_message([&] { parsed(text); });
}

std::vector<std::string> ids(const Sweep& s) {
  std::vector<std::string> out;
  for (const Run& r : s.runs) out.push_back(r.id);
  return out;
}

// A result without what differs between two trainings of the same run: the seconds, and the
// token of the pass that trained it.
Json timeless(Json result) {
  result.erase("seconds");
  result.erase("pass");
  result["config"].erase("blas");
  return result;
}

// The results in DIR, by id.
std::map<std::string, Json> results_in(const std::string& dir) {
  std::map<std::string, Json> out;
  std::ifstream in(dir + "/results.jsonl");
  for (std::string line; std::getline(in, line);) {
    Json j = Json::parse(line);
    out[j["id"]] = timeless(j);
  }
  return out;
}

const char* const small = R"({"tasks": ["rps", "cycle"], "grid": {"qk": ["untied", "tied"]},
                              "fixed": {"steps": 30, "layers": 1}, "seeds": {"start": 3, "count": 2}})";

}  // namespace

TEST_CASE("a sweep file names the product of its tasks, grid and seeds, each run with a stable id") {
  const Sweep s = parsed(small);
  REQUIRE(s.runs.size() == 8);
  CHECK(s.grid_keys == std::vector<std::string>{"qk"});
  // Task by task, then the grid, then the seeds.
  const std::vector<std::string> order = {"rps qk=untied 3", "rps qk=untied 4", "rps qk=tied 3", "rps qk=tied 4",
                                          "cycle qk=untied 3", "cycle qk=untied 4", "cycle qk=tied 3", "cycle qk=tied 4"};
  for (std::size_t i = 0; i < 8; ++i) {
    const Run& r = s.runs[i];
    CHECK(fmt::format("{} qk={} {}", r.task, r.options["qk"].get<std::string>(), r.seed) == order[i]);
    CHECK(r.id.starts_with(fmt::format("{}-qk={}-seed{}-", r.task, r.options["qk"].get<std::string>(), r.seed)));
    CHECK(r.train.steps == 30);
    CHECK(r.train.model.layers == 1);
    CHECK(r.train.seed == r.seed);
    CHECK(r.train.model.qk == (r.options["qk"] == "tied" ? nn::QK::tied : nn::QK::untied));
    CHECK(r.train.target == tasks::task_spec(r.task).target);
  }
  // Ids: unique; the same however the file spells the values; another fixed value, another id.
  std::vector<std::string> unique = ids(s);
  std::sort(unique.begin(), unique.end());
  CHECK(std::unique(unique.begin(), unique.end()) == unique.end());
  CHECK(ids(parsed(R"({"seeds": {"count": 2, "start": 3}, "fixed": {"layers": "1", "steps": "30"},
                       "tasks": ["rps", "cycle"], "grid": {"qk": ["untied", "tied"]}})")) == ids(s));
  const Sweep longer = parsed(R"({"tasks": ["rps", "cycle"], "grid": {"qk": ["untied", "tied"]},
                                  "fixed": {"steps": 31, "layers": 1}, "seeds": {"start": 3, "count": 2}})");
  CHECK(longer.runs[0].id.substr(0, 20) == s.runs[0].id.substr(0, 20));
  CHECK(longer.runs[0].id != s.runs[0].id);
  // Two grid keys: the last varies fastest; no grid and no seeds: one run a task, seed 0.
  const Sweep two = parsed(R"({"tasks": ["line"], "grid": {"d-model": [16, 32], "no-scale": [false, true]}, "fixed": {"steps": 5}})");
  REQUIRE(two.runs.size() == 4);
  CHECK(two.runs[1].options["d-model"] == 16);
  CHECK(two.runs[1].options["no-scale"] == true);
  CHECK_FALSE(two.runs[1].train.model.scale);
  CHECK(two.runs[2].train.model.d_model == 32);
  CHECK(parsed(R"({"tasks": ["brackets"]})").runs.size() == 1);
  CHECK(parsed(R"({"tasks": ["brackets"]})").runs[0].seed == 0);
}

TEST_CASE("a sweep's tasks may carry options, and its grid may name settings: labels, ids and options") {
  const Sweep s = parsed(R"j({"tasks": ["rps", {"task": "cycle", "n": 5}, {"task": "line", "n": 4, "label": "short line"}],
                             "grid": {"variant": {"untied": {}, "tied": {"qk": "tied"}, "W fixed (frozen)": {"proj": "frozen"}},
                                      "d_head": [2, 4]},
                             "fixed": {"steps": 20}, "measure": ["kv_cache"]})j");
  REQUIRE(s.runs.size() == 18);
  CHECK(s.grid_keys == std::vector<std::string>{"variant", "d_head"});
  CHECK(s.measurements == std::vector<std::string>{"kv_cache"});
  const Run& cycle = s.runs[6 + 3];  // cycle, tied, d_head 4
  CHECK(cycle.labels == Json{{"task", "cycle n=5"}, {"variant", "tied"}, {"d_head", 4}});
  CHECK(cycle.options == Json{{"steps", 20}, {"n", 5}, {"qk", "tied"}, {"d-head", 4}});
  CHECK(cycle.id.starts_with("cycle-n=5-variant=tied-d-head=4-seed0-"));
  CHECK(cycle.train.n == 5);
  CHECK(cycle.train.model.vocab_size == 5);
  CHECK(cycle.train.model.qk == nn::QK::tied);
  CHECK(cycle.train.model.d_head == 4);
  const Run& line = s.runs[12 + 4];  // line, identity, d_head 2
  CHECK(line.labels["task"] == "short line");
  CHECK(line.labels["variant"] == "W fixed (frozen)");
  CHECK(line.id.starts_with("line-n=4-variant=W_fixed__frozen_-d-head=2-seed0-"));  // a file name's characters only
  CHECK(line.train.model.proj == nn::Projection::frozen);
  CHECK(s.runs[0].labels == Json{{"task", "rps"}, {"variant", "untied"}, {"d_head", 2}});
  CHECK(s.runs[0].options == Json{{"steps", 20}, {"d-head", 2}});
  // What every run of a sweep records beyond its options: a checkpoint at the end, ten log lines,
  // and the steps to the target every 25 steps (50 past 300 steps).
  CHECK(s.runs[0].train.checkpoint_every == 20);
  CHECK(s.runs[0].train.log_every == 2);
  CHECK(s.runs[0].train.target_every == 25);
  const Sweep longer = parsed(R"({"tasks": ["rps"], "fixed": {"steps": 301, "checkpoint-every": 100}})");
  CHECK(longer.runs[0].train.target_every == 50);
  CHECK(longer.runs[0].train.checkpoint_every == 100);
  // The same options under a plain grid key or named settings: the same hash, another id.
  const std::string plain = parsed(R"({"tasks": ["rps"], "grid": {"qk": ["tied"]}})").runs[0].id;
  const std::string named = parsed(R"({"tasks": ["rps"], "grid": {"variant": {"tied": {"qk": "tied"}}}})").runs[0].id;
  CHECK(plain.starts_with("rps-qk=tied-seed0-"));
  CHECK(named.starts_with("rps-variant=tied-seed0-"));
  CHECK(plain.substr(plain.size() - 8) == named.substr(named.size() - 8));

  CHECK_THAT(refusal(R"({"tasks": [{"n": 3}]})"), Contains("'tasks'[0]: an object names its task"));
  CHECK_THAT(refusal(R"({"tasks": [{"task": "cycle", "m": 3}]})"), Contains("'tasks'[0] 'm' is not an option of qkv train"));
  CHECK_THAT(refusal(R"({"tasks": [{"task": "cycle", "n": 3}, {"task": "cycle", "n": 3}]})"),
             Contains("'tasks'[1]: 'cycle n=3' is listed twice"));
  CHECK_THAT(refusal(R"({"tasks": [{"task": "cycle", "n": 3}], "fixed": {"n": 4}})"),
             Contains("'tasks'[0] sets 'n', which 'fixed' sets too"));
  CHECK_THAT(refusal(R"({"tasks": ["rps"], "grid": {"variant": {}}})"), Contains("'grid' 'variant' must name one or more settings"));
  CHECK_THAT(refusal(R"({"tasks": ["rps"], "grid": {"variant": {"a": {"qk": "square"}}}})"),
             Contains("'grid' 'variant' 'a' 'qk': must be one of untied, tied, symmetric, got 'square'"));
  CHECK_THAT(refusal(R"({"tasks": ["rps"], "grid": {"variant": {"a": {"qk": "tied"}}, "qk": ["untied"]}})"),
             Contains("'grid' 'qk' sets 'qk', which 'grid' 'variant' 'a' sets too"));
  CHECK_THAT(refusal(R"({"tasks": ["rps"], "grid": {"attention": {"a": {}}}, "fixed": {"attention": "causal"}})"),
             Contains("'grid' 'attention' names settings, and 'fixed' sets the option 'attention'"));
  CHECK_THAT(refusal(R"({"tasks": ["rps"], "grid": {"v": {"a/b": {}, "a_b": {}}}})"), Contains("two runs have this id"));
  CHECK_THAT(refusal(R"({"tasks": ["rps"], "measure": ["speed"]})"), Contains("'measure'[0]: ") && Contains("unknown measurement 'speed'"));
  CHECK_THAT(refusal(R"({"tasks": [{"task": "rps", "label": "a"}, {"task": "rps", "label": "b"}]})"),
             Contains("'tasks'[1]: trains the task and options of 'tasks'[0] ('a') again"));
  CHECK_THAT(refusal(R"({"tasks": ["rps"], "grid": {"accuracy": {"a": {}}}})"),
             Contains("'grid' 'accuracy': a result has a key of that name"));
  // A measurement that cannot measure a run says so before anything trains.
  CHECK_THAT(refusal(R"({"tasks": ["rps"], "measure": ["longer_lengths"]})"),
             Contains("'measure' 'longer_lengths': the rps task has no longer lengths to test on"));
  CHECK_THAT(refusal(R"({"tasks": ["brackets"], "measure": ["longer_lengths"]})"),
             Contains("'measure' 'longer_lengths': its longest sequences need 'max-len' 65 (the model has 25 positions)"));
  CHECK(parsed(R"({"tasks": ["brackets"], "fixed": {"max-len": 65}, "measure": ["longer_lengths"]})").runs.size() == 1);
}

TEST_CASE("results.csv: a column per task label, named setting, option, metric and measurement, a row per run") {
  const Sweep s = parsed(R"({"tasks": [{"task": "induction", "heads": 2}],
                             "grid": {"attention": {"MHA": {"kv-heads": 2}, "MQA": {"kv-heads": 1}}},
                             "fixed": {"steps": 3}, "measure": ["kv_cache"]})");
  const std::string dir = scratch("sweep_csv");
  std::ostringstream progress;
  CHECK(run_workers(s, {.out = dir, .jobs = 1}, progress).ran == 2);
  const Collected c = collect(s, dir, false);
  REQUIRE(c.results.size() == 2);
  std::ifstream in(dir + "/results.csv");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0] == "id,task,task_label,seed,attention,steps,heads,kv-heads,status,accuracy,steps_to_target,target,"
                    "seconds,sigma_init,sigma,score_asymmetry_init,score_asymmetry,kv_cache_bytes_per_token,error");
  // 2 layers × 1 kv head × (d_head 16 + d_v 16) × 4 bytes a token; the rest as the result says.
  const Json& mqa = c.results[1];
  CHECK(mqa["labels"] == Json{{"task", "induction heads=2"}, {"attention", "MQA"}});
  CHECK(mqa["kv_cache_bytes_per_token"] == 2 * 1 * 32 * 4);
  CHECK(lines[2] == fmt::format("{},induction,induction heads=2,0,MQA,3,2,1,ok,{},,{},{},{},{},,,256,", mqa["id"].get<std::string>(),
                                mqa["accuracy"].dump(), mqa["target"].dump(), mqa["seconds"].dump(), mqa["sigma_init"].dump(),
                                mqa["sigma"].dump()));
  CHECK_THAT(c.summary, Contains("| task | attention | runs |"));
  CHECK_THAT(c.summary, Contains("| induction heads=2 | MQA | 1 | 0 |"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a sweep file is refused before anything runs, naming the key and the run at fault") {
  CHECK_THAT(refusal("[1]"), Contains("s.json: a sweep is one JSON object"));
  CHECK_THAT(refusal(R"({"tasks": ["rps"], "grids": {}})"), Contains("unknown key 'grids'"));
  CHECK_THAT(refusal(R"({"grid": {}})"), Contains("'tasks' is missing"));
  CHECK_THAT(refusal(R"({"tasks": []})"), Contains("'tasks' must be a list of one or more"));
  CHECK_THAT(refusal(R"({"tasks": ["rps", "chess"]})"), Contains("'tasks'[1]: ") && Contains("chess"));
  CHECK_THAT(refusal(R"({"tasks": ["rps", "rps"]})"), Contains("'tasks'[1]: 'rps' is listed twice"));
  CHECK_THAT(refusal(R"({"tasks": ["rps"], "grid": {"width": [1]}})"), Contains("'grid' 'width' is not an option of qkv train"));
  CHECK_THAT(refusal(R"({"tasks": ["rps"], "grid": {"seed": [1, 2]}})"), Contains("'grid' 'seed': the seeds are given by"));
  CHECK_THAT(refusal(R"({"tasks": ["rps"], "fixed": {"out": "x"}})"), Contains("'fixed' 'out': the sweep decides it"));
  CHECK_THAT(refusal(R"({"tasks": ["rps"], "grid": {"threads": [1, 2]}})"), Contains("'grid' 'threads': the sweep decides it"));
  CHECK_THAT(refusal(R"({"tasks": ["rps"], "grid": {"steps": [10, 0]}})"),
             Contains("'grid' 'steps'[1]: must be a whole number from 1 to 1000000000, got '0'"));
  CHECK_THAT(refusal(R"({"tasks": ["rps"], "grid": {"qk": "tied"}})"), Contains("'grid' 'qk' must be a list"));
  CHECK_THAT(refusal(R"({"tasks": ["rps"], "grid": {"qk": ["tied", "tied"]}})"), Contains("'grid' 'qk'[1]: \"tied\" is listed twice"));
  CHECK_THAT(refusal(R"({"tasks": ["rps"], "grid": {"qk": ["tied"]}, "fixed": {"qk": "untied"}})"),
             Contains("'grid' 'qk' sets 'qk', which 'fixed' sets too"));
  CHECK_THAT(refusal(R"({"tasks": ["rps"], "fixed": {"d_model": 16, "d-model": 32}})"), Contains("'d-model' is given twice"));
  CHECK_THAT(refusal(R"({"tasks": ["rps"], "seeds": {"count": 0}})"), Contains("'seeds' 'count': must be a whole number from 1"));
  CHECK_THAT(refusal(R"({"tasks": ["rps"], "seeds": {"first": 0}})"), Contains("'seeds': unknown key 'first'"));
  CHECK_THAT(refusal(R"({"tasks": ["rps"], "seeds": {"start": 18446744073709551615, "count": 2}})"),
             Contains("past the largest seed"));
  CHECK_THAT(refusal(R"({"tasks": ["rps"], "grid": {"steps": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}, "seeds": {"count": 100001}})"),
             Contains("names more than 1000000 runs"));
  // A value only some tasks refuse, or options that do not go together: the run is named.
  CHECK_THAT(refusal(R"({"tasks": ["line", "rps"], "fixed": {"n": 5}})"), Contains("run rps-seed0-") && Contains("'n' rps: the rps task takes no size"));
  CHECK_THAT(refusal(R"({"tasks": ["rps"], "grid": {"heads": [2, 3]}, "fixed": {"d-model": 32}})"),
             Contains("run rps-heads=3-seed0-") && Contains("'heads'"));
  // A measurement of the other kind of model.
  CHECK_THAT(refusal(R"({"tasks": ["reverse"], "measure": ["self_attention"]})"),
             Contains("run reverse-seed0-") && Contains("'measure' 'self_attention' measures decoder-only models, and reverse "
                                                        "trains an encoder-decoder"));
  CHECK_THAT(refusal(R"({"tasks": ["rps"], "measure": ["alignment"]})"),
             Contains("'measure' 'alignment' measures seq2seq runs, and rps trains a decoder-only model"));
}

TEST_CASE("a seq2seq sweep: accuracy, σ of the cross-attention and the alignment along and after training") {
  const Sweep s = parsed(R"({"tasks": ["reverse"], "grid": {"qk": ["untied", "tied"]}, "fixed": {"steps": 40},
                              "measure": ["alignment"]})");
  const std::string dir = scratch("sweep_seq2seq");
  std::ostringstream progress;
  REQUIRE(run_workers(s, {.out = dir, .jobs = 1}, progress).failed == 0);
  const Collected c = collect(s, dir, false);
  REQUIRE(c.results.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    const Json& r = c.results[i];
    INFO(r.dump().substr(0, 400));
    REQUIRE(r["status"] == "ok");
    CHECK(r["curve"].front()["step"] == 0);
    CHECK(r["curve"].back()["step"] == 40);
    CHECK(r["score_asymmetry"].is_null());
    // The model the run ends with, measured again: teacher-forced accuracy, greedy decoding, and the
    // mean σ of the cross-attention heads (1 for tied ones).
    const auto model = training::load_encoder_decoder(dir + "/runs/" + s.runs[i].id);
    const auto task = tasks::make_task("reverse");
    const tasks::Seq2SeqTask& seq2seq = *tasks::as_seq2seq(*task);
    const tasks::TrainOptions& o = s.runs[i].train;
    CHECK(r["accuracy"].get<double>() == tasks::evaluate(*model, *task, o.eval_batches, o.batch, o.seed).accuracy);
    CHECK(r["exact_match_generated"].get<double>() == tasks::evaluate_generation(*model, seq2seq, 32, 32, 1).exact_match);
    const analysis::AlignmentInspection in = analysis::inspect_alignment(*model, seq2seq, analysis::typical_source(seq2seq));
    double sigma = 0, best = 0;
    for (const analysis::CrossHead& h : in.layers.back()) {
      sigma += h.sigma / double(in.layers.back().size());
      best = std::max(best, h.held_out);
      CHECK(r["alignment"]["heads"][fmt::format("L{}H{}", h.layer, h.head)]["weight"].get<double>() == h.held_out);
    }
    CHECK(r["sigma"].get<double>() == Approx(sigma).epsilon(1e-12));
    CHECK(r["alignment"]["best_weight"].get<double>() == best);
    CHECK(r["alignment"]["any_head_top1"].get<double>() == in.any_head_top1.back());
    if (i == 1) CHECK(r["sigma"].get<double>() == Approx(1.0).epsilon(1e-9));
  }
  CHECK(c.results[0]["sigma"].get<double>() < 0.9);
}

TEST_CASE("a sweep's runs on two processes, or in two slices, give the results of each run trained alone") {
  const Sweep s = parsed(small);
  const std::string dir = scratch("sweep");
  std::ostringstream progress;
  WorkerReport r = run_workers(s, {.out = dir + "/parallel", .jobs = 2}, progress);
  CHECK(r.ran == 8);
  CHECK(r.failed == 0);
  const Collected c = collect(s, dir + "/parallel", false);
  REQUIRE(c.results.size() == 8);
  CHECK(c.missing.empty());
  for (std::size_t i = 0; i < 8; ++i) CHECK(c.results[i]["id"] == s.runs[i].id);  // the sweep's order

  // Two slices, one after the other, in one process each.
  for (std::size_t i = 0; i < 2; ++i) {
    r = run_workers(s, {.out = dir + "/sliced", .jobs = 1, .index = i, .of = 2}, progress);
    CHECK(r.ran == 4);
  }
  collect(s, dir + "/sliced", false);
  const auto parallel = results_in(dir + "/parallel"), sliced = results_in(dir + "/sliced");
  REQUIRE(parallel.size() == 8);
  for (const auto& [id, result] : parallel) {
    CHECK(result["status"] == "ok");
    CHECK(result.dump() == timeless(sliced.at(id)).dump());
  }

  // One run trained alone with the same options: the same accuracy, to the bit.
  tasks::TrainOptions alone = s.runs[5].train;
  alone.out = dir + "/alone";
  std::ostringstream quiet;
  const training::TrainResult trained = training::train(alone, quiet, false);
  CHECK(parallel.at(s.runs[5].id)["accuracy"].get<double>() == trained.eval.accuracy);
  CHECK(nn::read_file(alone.out + "/model.safetensors", 1 << 24) ==
        nn::read_file(dir + "/parallel/runs/" + s.runs[5].id + "/model.safetensors", 1 << 24));

  // A rerun has nothing left to do.
  r = run_workers(s, {.out = dir + "/parallel", .jobs = 2}, progress);
  CHECK(r.ran == 0);
  CHECK(r.finished == 8);
}

TEST_CASE("a stopped worker's run goes on from its checkpoint and kept curve, to the result of a whole run") {
  Sweep s = parsed(R"({"tasks": ["cycle"], "fixed": {"steps": 200}, "seeds": {"start": 2, "count": 1}})");
  s.runs[0].train.target = 0.3;  // passed by a check before the stop, which the resumed run must report
  const std::string dir = scratch("sweep_resume");
  std::ostringstream progress;
  CHECK(run_workers(s, {.out = dir + "/whole", .jobs = 1}, progress).ran == 1);
  const Json whole = timeless(*result_of(dir + "/whole", s.runs[0]));
  REQUIRE(whole["steps_to_target"].is_number());
  REQUIRE(whole["steps_to_target"].get<std::size_t>() <= 75);

  // What a worker stopped after step 90 leaves: the run's folder with its checkpoint of step 90, and
  // the curve's points of steps 0-50 beside it.
  const std::string runs = dir + "/stopped/runs/", curve = runs + s.runs[0].id + ".curve.jsonl";
  std::filesystem::create_directories(runs);
  tasks::TrainOptions part = s.runs[0].train;
  part.out = runs + s.runs[0].id;
  part.force = true;
  part.stop_after = 90;
  Json partial;
  std::vector<std::string> violations;
  CHECK_THROWS_WITH(measure_run(partial, part, {}, violations, progress, false, curve),
                    Contains("the run's curve does not run from step 0 to step 90"));
  CHECK(resumable_step(part, curve) == 90u);
  // A curve file without every point up to the checkpoint, or other options: trained from the start.
  const std::string points = nn::read_file(curve, 1 << 20);
  nn::write_atomically(curve, points.substr(0, points.find('\n') + 1) + "{\"point\": {\"st");  // step 0, then a cut line
  CHECK_FALSE(resumable_step(part, curve));
  // A point past the checkpoint, as a run killed after measuring step 100 but before a checkpoint
  // there leaves it: measured again, it is replaced.
  nn::write_atomically(curve, points + R"({"point": {"step": 100, "accuracy": 0.125}, "violations": ["at step 100: stale"]})" + "\n");
  CHECK(resumable_step(part, curve) == 90u);
  tasks::TrainOptions other = part;
  other.lr *= 2;
  CHECK_FALSE(resumable_step(other, curve));

  progress.str("");
  CHECK(run_workers(s, {.out = dir + "/stopped", .jobs = 1}, progress).ran == 1);
  CHECK_THAT(progress.str(), Contains("goes on from its checkpoint of step 90"));
  const Json resumed = timeless(*result_of(dir + "/stopped", s.runs[0]));
  CHECK(resumed["curve"] == whole["curve"]);
  CHECK(resumed["violations"] == whole["violations"]);
  CHECK(resumed["steps_to_target"] == whole["steps_to_target"]);
  CHECK(resumed["accuracy"] == whole["accuracy"]);
  CHECK(resumed.dump() == whole.dump());  // the seconds aside
  CHECK_FALSE(std::filesystem::exists(curve));  // its points are in the result
  CHECK(nn::read_file(dir + "/whole/runs/" + s.runs[0].id + "/model.safetensors", 1 << 24) ==
        nn::read_file(runs + s.runs[0].id + "/model.safetensors", 1 << 24));
}

TEST_CASE("a sweep's worker leaves a run another one holds, and collecting names the runs without a result") {
  const Sweep s = parsed(R"({"tasks": ["rps"], "fixed": {"steps": 20, "layers": 1}, "seeds": {"count": 3}})");
  const std::string dir = scratch("sweep_busy");
  std::filesystem::create_directories(dir + "/runs");
  std::filesystem::create_directories(dir + "/results");
  nn::write_atomically(dir + "/sweep.json", "{}");
  // Another worker holds the second run.
  const int fd = ::open((dir + "/runs/" + s.runs[1].id + ".lock").c_str(), O_RDWR | O_CREAT, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  std::ostringstream progress;
  const WorkerReport r = run_workers(s, {.out = dir, .jobs = 1}, progress);
  CHECK(r.ran == 2);
  CHECK(r.busy == 1);
  CHECK_THROWS_WITH(collect(s, dir, false), Contains("1 of 3 runs have no result yet (" + s.runs[1].id + ")") &&
                                                 Contains("--partial"));
  const Collected partial = collect(s, dir, true);
  CHECK(partial.results.size() == 2);
  CHECK(partial.missing == std::vector<std::string>{s.runs[1].id});
  ::close(fd);
  // Its worker killed (the lock gone, a run folder half written): the next pass trains it from the start.
  std::filesystem::create_directories(dir + "/runs/" + s.runs[1].id);
  std::ofstream(dir + "/runs/" + s.runs[1].id + "/metrics.jsonl") << "{\"step\": 1";
  CHECK(run_workers(s, {.out = dir, .jobs = 1}, progress).ran == 1);
  CHECK(collect(s, dir, false).results.size() == 3);
}

TEST_CASE("a failed run is recorded with its error, the others go on, and a folder that is not a sweep's is refused") {
  // A model too large for memory passes the file's checks and fails when it trains.
  const Sweep s = parsed(R"({"tasks": ["rps"], "grid": {"d-model": [16, 200000]}, "fixed": {"steps": 10, "layers": 1, "heads": 1}})");
  const std::string dir = scratch("sweep_failed");
  std::ostringstream progress;
  const WorkerReport r = run_workers(s, {.out = dir + "/out", .jobs = 1}, progress);
  CHECK(r.ran == 2);
  CHECK(r.failed == 1);
  const Collected c = collect(s, dir + "/out", false);
  CHECK(c.failed == 1);
  CHECK(c.results[0]["status"] == "ok");
  CHECK(c.results[1]["status"] == "failed");
  CHECK_THAT(c.results[1]["error"].get<std::string>(), Contains("this machine has available"));
  CHECK_THAT(c.summary, Contains("| rps | 200000 | 1 | 1 | - | - |"));
  CHECK_THAT(progress.str(), Contains(s.runs[1].id + ": FAILED: "));

  // A rerun tries the failed run again, once; so does a pass of two processes, though the other
  // process comes to it again after the first one failed it.
  WorkerReport again = run_workers(s, {.out = dir + "/out", .jobs = 1}, progress);
  CHECK(again.ran == 1);
  CHECK(again.failed == 1);
  CHECK(again.finished == 1);
  again = run_workers(s, {.out = dir + "/out", .jobs = 2}, progress);
  CHECK(again.ran == 1);
  CHECK(again.failed == 1);
  const Sweep three = parsed(R"({"tasks": ["rps"], "grid": {"d-model": [16, 200000, 8]}, "fixed": {"steps": 200, "layers": 1, "heads": 1}})");
  const WorkerReport both = run_workers(three, {.out = dir + "/two", .jobs = 2}, progress);
  CHECK(both.ran == 3);
  CHECK(both.failed == 1);

  std::filesystem::create_directories(dir + "/mine");
  std::ofstream(dir + "/mine/notes.txt") << "mine";
  CHECK_THROWS_WITH(run_workers(s, {.out = dir + "/mine", .jobs = 1}, progress), Contains("holds files of something other than a sweep"));
  std::vector<std::string> entries;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/mine")) entries.push_back(entry.path().filename());
  CHECK(entries == std::vector<std::string>{"notes.txt"});  // nothing written beside it
}

TEST_CASE("the summary: a row a configuration with k of n seeds past the target and its Wilson interval") {
  const Sweep s = parsed(R"({"tasks": ["rps"], "grid": {"qk": ["untied", "tied"]}, "seeds": {"count": 3}})");
  Json results = Json::array();
  const double accuracy[] = {1.0, 0.995, 0.5, 0.2, 0.4, 0.3};  // target 0.99: 2 of 3 untied, 0 of 3 tied
  for (std::size_t i = 0; i < 6; ++i)
    results.push_back({{"id", s.runs[i].id}, {"task", "rps"}, {"seed", s.runs[i].seed}, {"options", s.runs[i].options},
                       {"status", "ok"}, {"accuracy", accuracy[i]}, {"target", 0.99}});
  const std::string table = summary_table(s, results);
  CHECK_THAT(table, Contains("| rps | untied | 3 | 0 | 0.832 ± 0.287 (n = 3) | 2 of 3 at 99% (21–94%) |"));
  CHECK_THAT(table, Contains("| rps | tied | 3 | 0 | 0.300 ± 0.100 (n = 3) | 0 of 3 at 99% (0–56%) |"));
}

TEST_CASE("a sweep as a Slurm job array: a task a slice of per_task runs, throttled, each run by the qkv program") {
  const Sweep s = parsed(small);  // 8 runs
  const std::string dir = scratch("sweep_slurm");
  const std::string script =
      slurm_script(s, {.out = dir + "/out", .program = "/opt/qkv's bin/qkv", .per_task = 3, .throttle = 2,
                       .sbatch = {"--partition=short", "--time=1:00:00"}});
  CHECK_THAT(script, Contains("#SBATCH --array=0-2%2\n"));  // 3 tasks: 3, 3 and 2 runs
  CHECK_THAT(script, Contains("#SBATCH --partition=short\n#SBATCH --time=1:00:00\n"));
  CHECK_THAT(script, Contains("#SBATCH --output=" + dir + "/out/slurm/%A_%a.out\n"));
  CHECK_THAT(script, Contains("exec '/opt/qkv'\\''s bin/qkv' sweep '" + dir + "/out/sweep.json' --out '" + dir +
                              "/out' --index \"$SLURM_ARRAY_TASK_ID\" --of 3 -j 1\n"));
  CHECK_THAT(slurm_script(s, {.out = dir, .program = "/q", .per_task = 8}), Contains("#SBATCH --array=0-0\n"));
  CHECK_THAT(slurm_script(s, {.out = dir, .program = "/q", .per_task = 1}), Contains("#SBATCH --array=0-7\n"));
  CHECK_THROWS_WITH(slurm_script(s, {.out = dir, .program = "/q", .per_task = 0}), Contains("--per-task 0"));
  CHECK_THROWS_WITH(slurm_script(s, {.out = dir, .program = "/q", .sbatch = {"--a\n--b"}}), Contains("one line"));

  // Written: executable, beside the sweep's file, which its tasks read back as the same runs.
  const std::string path = write_slurm_script(s, {.out = dir + "/out", .program = "/q", .per_task = 3});
  CHECK(path == dir + "/out/sweep.sbatch");
  CHECK((std::filesystem::status(path).permissions() & std::filesystem::perms::owner_exec) != std::filesystem::perms::none);
  CHECK(ids(read_sweep(dir + "/out/sweep.json")) == ids(s));
}
