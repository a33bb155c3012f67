#include "tests/helpers.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "examples/train.hpp"
#include "nn/safetensors.hpp"

using namespace qkv;
using namespace qkv::examples;

namespace {

TrainOptions short_run(const std::string& task, const std::string& out) {
  TrainOptions o = default_options(task);
  o.steps = 30;
  o.warmup = 5;
  o.log_every = 10;
  o.eval_batches = 2;
  o.out = (std::filesystem::temp_directory_path() / ("qkv_train_" + out + "_" + std::to_string(::getpid()))).string();
  return o;
}

}  // namespace

TEST_CASE("the same seed trains bit-identical weights, and another seed does not") {
  for (const std::string& task : task_names()) {
    INFO(task);
    std::ostringstream quiet;
    TrainOptions a = short_run(task, "a"), b = short_run(task, "b"), c = short_run(task, "c");
    c.seed = 1;
    train(a, quiet, false);
    train(b, quiet, false);
    train(c, quiet, false);
    const auto wa = nn::load_safetensors(a.out + "/model.safetensors").tensors;
    const auto wb = nn::load_safetensors(b.out + "/model.safetensors").tensors;
    const auto wc = nn::load_safetensors(c.out + "/model.safetensors").tensors;
    REQUIRE(wa.size() == wb.size());
    bool all_same_c = true;
    for (std::size_t i = 0; i < wa.size(); ++i) {
      CHECK(wa[i].first == wb[i].first);
      CHECK(wa[i].second.value<float>() == wb[i].second.value<float>());
      all_same_c = all_same_c && wa[i].second.value<float>() == wc[i].second.value<float>();
    }
    CHECK_FALSE(all_same_c);
  }
}

TEST_CASE("training writes its config, one metrics line per log step, and the model") {
  std::ostringstream progress;
  const TrainOptions o = short_run("brackets", "files");
  const TrainResult r = train(o, progress, false);
  CHECK(r.steps == 30);
  CHECK(std::filesystem::exists(o.out + "/config.json"));
  std::ifstream metrics(o.out + "/metrics.jsonl");
  std::size_t lines = 0;
  for (std::string line; std::getline(metrics, line);) ++lines;
  CHECK(lines == 3);
  CHECK(progress.str().find("step    30/30") != std::string::npos);
  const auto state = nn::load_safetensors(o.out + "/model.safetensors");
  CHECK(state.tensors.front().first == "tok.weight");
  CHECK(state.metadata.at("task") == "brackets");
  CHECK(r.eval.scored > 0);
}

TEST_CASE("a one-step run trains and evaluates") {
  std::ostringstream quiet;
  TrainOptions o = short_run("rps", "one");
  o.steps = 1;
  CHECK(train(o, quiet, false).steps == 1);
}
