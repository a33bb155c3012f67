#include "tests/helpers.hpp"

#include <functional>

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "qkv/analysis/inspect.hpp"
#include "qkv/report/inspect.hpp"
#include "qkv/analysis/history.hpp"
#include "qkv/report/snapshots.hpp"
#include "qkv/nn/circuits.hpp"
#include "qkv/nn/files.hpp"
#include "tests/training/short_run.hpp"

using namespace qkv;
using namespace qkv::test;
using Catch::Matchers::Contains;

namespace {

std::vector<std::size_t> steps_of(const std::vector<nlohmann::json>& lines) {
  std::vector<std::size_t> steps;
  for (const auto& j : lines) steps.push_back(j.at("step"));
  return steps;
}

void append(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::app);
  out << text;
}

}  // namespace

TEST_CASE("snapshots: at step 0, log-spaced steps below N, every N steps and the last") {
  for (std::size_t step : {10, 20, 30, 50, 100, 200, 300, 500, 1000, 50000}) CHECK(log_spaced(step));
  for (std::size_t step : {0, 1, 5, 9, 11, 40, 70, 150, 250, 1001, 4000}) CHECK_FALSE(log_spaced(step));
  TrainOptions o = default_options("brackets");
  o.steps = 1500;
  o.snapshot_every = 400;
  const auto task = make_task("brackets");
  const Snapshots s(o, *task);
  std::vector<std::size_t> due;
  for (std::size_t step = 0; step <= o.steps; ++step)
    if (s.due(step)) due.push_back(step);
  CHECK(due == std::vector<std::size_t>{0, 10, 20, 30, 50, 100, 200, 300, 400, 800, 1200, 1500});
  o.snapshot_every = 0;
  CHECK_FALSE(Snapshots(o, *task).due(0));
}

TEST_CASE("snapshots: each line is the model at its step, and a resumed run writes the same file") {
  std::ostringstream quiet;
  TrainOptions whole = short_run("induction", "snapshots", 40, 10);
  whole.snapshot_every = 20;
  const TrainResult r = train(whole, quiet, false);
  const std::vector<nlohmann::json> lines = read_json_lines(whole.out + "/snapshots.jsonl");
  CHECK(steps_of(lines) == std::vector<std::size_t>{0, 10, 20, 40});
  // The last line is the trained model: its accuracy the run's, its circuits the checkpoint's.
  const nlohmann::json& last = lines.back();
  CHECK(last.at("accuracy").get<double>() == r.eval.accuracy);
  const auto model = load_model(whole.out);
  for (std::size_t l = 0; l < 2; ++l) {
    const Array<double> qk = nn::qk_circuit(model->blocks[l]->attn, 0);
    const nlohmann::json& head = last.at("layers")[l].at("heads")[0];
    CHECK(head.at("sigma").get<double>() == Approx(nn::symmetric_share(qk)).epsilon(1e-12));
    CHECK(head.at("qk_circuit")[3][5].get<double>() == Approx(qk(3, 5)).epsilon(1e-12));
    // Causal attention on the input: each row's weights sum to 1 over the keys it sees.
    const nlohmann::json& attention = head.at("attention");
    REQUIRE(attention.size() == last.at("input").size());
    for (std::size_t i = 0; i < attention.size(); ++i) {
      double total = 0;
      for (std::size_t j = 0; j < attention[i].size(); ++j) {
        if (j > i) CHECK(attention[i][j].is_null());
        else total += attention[i][j].get<double>();
      }
      CHECK(total == Approx(1).epsilon(1e-6));
    }
  }
  CHECK(last.at("composition")[0].at("k").get<double>() ==
        Approx(nn::composition_score(model->blocks[0]->attn, 0, model->blocks[1]->attn, 0, nn::Composition::k)));
  CHECK(lines.front().at("layers")[1].at("heads")[0].at("sigma") != last.at("layers")[1].at("heads")[0].at("sigma"));

  // Stopped at step 25 after a snapshot the kill left past its checkpoint, then resumed.
  TrainOptions first = short_run("induction", "snapshots_split", 40, 10);
  first.snapshot_every = 20;
  first.stop_after = 25;
  train(first, quiet, false);
  CHECK(steps_of(read_json_lines(first.out + "/snapshots.jsonl")) == std::vector<std::size_t>{0, 10, 20});
  // A whole snapshot (nested as deep as any) of step 30, as a run killed before its checkpoint left it.
  nlohmann::json later = read_json_lines(first.out + "/snapshots.jsonl").back();
  later["step"] = 30;
  append(first.out + "/snapshots.jsonl", later.dump() + "\n");
  TrainOptions rest = read_config(first.out);
  CHECK(rest.snapshot_every == 20);
  rest.resume = true;
  rest.eval_batches = whole.eval_batches;  // the program's is fixed; config.json does not record it
  train(rest, quiet, false);
  CHECK(nn::read_file(rest.out + "/snapshots.jsonl", 1 << 24) == nn::read_file(whole.out + "/snapshots.jsonl", 1 << 24));
  for (const auto& o : {whole, first}) std::filesystem::remove_all(o.out);
}

TEST_CASE("snapshots: the history of a run folder, a line cut short, a broken line, and the page's training section") {
  std::ostringstream quiet;
  TrainOptions o = short_run("induction", "history", 30, 10);
  o.snapshot_every = 10;
  train(o, quiet, false);
  const TrainingHistory h = read_history(o.out, o.model);
  CHECK(h.logged.size() == 3);  // log_every 10
  REQUIRE(h.snapshots.size() == 4);
  CHECK(h.snapshots[3].step == 30);
  CHECK(h.snapshots[3].sigma.size() == 2);
  CHECK(std::isnan(h.snapshots[3].attention[0][0](0, 1)));  // masked: after the query
  CHECK(h.snapshots[3].attention[0][0](0, 0) == Approx(1));

  // A kill while the last line was written: that line is left out.
  const std::string file = o.out + "/snapshots.jsonl";
  append(file, "{\"step\": 40, \"accur");
  CHECK(read_history(o.out, o.model).snapshots.size() == 4);
  // A broken line before the last is named.
  append(file, "\n{\"step\": 50}\n");
  CHECK_THROWS_WITH(read_history(o.out, o.model), Contains("snapshots.jsonl (line 5)"));
  nn::write_atomically(file, nn::read_file(file, 1 << 24).substr(0, nn::read_file(file, 1 << 24).find("{\"step\": 40")));
  append(file, "{\"step\": 50}\n");
  CHECK_THROWS_WITH(read_history(o.out, o.model), Contains("snapshots.jsonl (line 5)") && Contains("accuracy"));

  // Hostile or inconsistent lines are named, never drawn.
  nn::write_atomically(file, nn::read_file(file, 1 << 24).substr(0, nn::read_file(file, 1 << 24).find("{\"step\": 50")));
  const std::string good = nn::read_file(file, 1 << 24);
  nlohmann::json line = read_json_lines(file).back();
  for (const auto& [step, why] : {std::pair<nlohmann::json, std::string>{-1, "'step' is -1"},
                                  {1e300, "'step' is 1e+300"},
                                  {18446744073709551615ULL, "'step' is 18446744073709551615"}}) {
    line["step"] = step;
    nn::write_atomically(file, good + line.dump() + "\n");
    CHECK_THROWS_WITH(read_history(o.out, o.model), Contains("snapshots.jsonl (line 5): " + why));
  }
  line["step"] = 40;
  line["layers"] = nlohmann::json::array();
  nn::write_atomically(file, good + line.dump() + "\n");
  CHECK_THROWS_WITH(read_history(o.out, o.model), Contains("(line 5): 'layers' is 0 entries, where the run's config.json has 2"));
  line = read_json_lines(file).front();
  line["input"].push_back(3);
  nn::write_atomically(file, good + line.dump() + "\n");
  CHECK_THROWS_WITH(read_history(o.out, o.model), Contains("(line 5): an attention of 24 rows for 25 tokens"));
  // Every size is the run's own, checked by type before it is used: no field is trusted.
  const nlohmann::json valid = parse_json_lines(good, file).back();
  const auto refused = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& why) {
    nlohmann::json bad = valid;
    edit(bad);
    nn::write_atomically(file, good + bad.dump() + "\n");
    CHECK_THROWS_WITH(read_history(o.out, o.model), Contains("snapshots.jsonl (line 5): " + why));
  };
  refused([](auto& j) { j["layers"] = nullptr; }, "'layers' is not an array, where the run's config.json has 2");
  refused([](auto& j) { j["layers"][1]["heads"] = nullptr; }, "'heads' is not an array, where the run's config.json has 1");
  refused([](auto& j) { j["layers"][0]["heads"].push_back(j["layers"][0]["heads"][0]); },
          "'heads' is 2 entries, where the run's config.json has 1");
  REQUIRE(valid.at("composition").size() == 1);  // layer 0's head into layer 1's
  refused([](auto& j) { j["composition"][0]["from_layer"] = -1; }, "'from_layer' is -1, not a whole number in [0, 1]");
  refused([](auto& j) { j["composition"][0]["from_layer"] = 1e300; }, "'from_layer' is 1e+300, not a whole number in [0, 1]");
  refused([](auto& j) { j["composition"][0]["to_head"] = 1; }, "'to_head' is 1, not a whole number in [0, 0]");
  refused([](auto& j) { j["composition"][0]["to_layer"] = 0; }, "a composition from layer 0 into layer 0, not a later one");
  refused([](auto& j) { j["composition"].push_back(j["composition"][0]); }, "'composition' is not an array of at most 1 pairs");
  refused([](auto& j) { j["input"][0] = 1e300; }, "'input'[0] is 1e+300, not a whole number in [0, " +
                                                      std::to_string(o.model.vocab_size - 1) + "]");
  refused([](auto& j) { j["input"][2] = -4; }, "'input'[2] is -4");
  refused([&](auto& j) { j["input"] = std::vector<int>(o.model.max_len + 1, 1); },
          "'input' is " + std::to_string(o.model.max_len + 1) + " tokens, not 1 to " + std::to_string(o.model.max_len));
  refused([](auto& j) { j["probes"] = nlohmann::json::array(); }, "'probes' is not an object");
  nn::write_atomically(file, good);

  // The page draws the curves and the attention at a few snapshots.
  const auto task = make_task("induction");
  Inspection in = inspect(*load_model(o.out), *task, typical_input(*task), o.out);
  CHECK(to_html(in).find("<h2>Training</h2>") == std::string::npos);
  in.history = h;
  const std::string page = to_html(in);
  CHECK_THAT(page, Contains("<h2>Training</h2>"));
  CHECK_THAT(page, Contains("the heads along training"));
  CHECK_THAT(page, Contains("L1H0 at step 30<"));
  CHECK_THAT(page, Contains("L0H0→L1H0 K"));
  // And as files: the two charts, and the attention at the snapshots shown.
  const auto files = write_svgs(in, o.out + "/svg");
  for (const char* name : {"/svg/training.svg", "/svg/training-heads.svg", "/svg/L1H0-step-30.svg", "/svg/L0H0-step-0.svg"})
    CHECK(std::find(files.begin(), files.end(), o.out + name) != files.end());
  // Each head's four pictures, the two charts, and each head at the same two to four steps.
  std::size_t steps = 0;
  for (const auto& f : files)
    if (f.find("/L0H0-step-") != std::string::npos) {
      ++steps;
      CHECK(std::find(files.begin(), files.end(), std::string(f).replace(f.find("/L0H0-"), 6, "/L1H0-")) != files.end());
    }
  CHECK(steps >= 2);
  CHECK(steps <= 4);
  CHECK(files.size() == 2 * 4 + 2 + 2 * steps);
  std::filesystem::remove_all(o.out);
}
