// Writes the checkpoint fuzzer's seed corpus into a folder: the three valid files of the fuzz
// run, and one broken file for each fault the loader names.
//   qkv_fuzz_corpus fuzz/corpus
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>

#include <nlohmann/json.hpp>

#include "qkv/analysis/history.hpp"
#include "qkv/report/snapshots.hpp"
#include "qkv/tasks/task.hpp"
#include "fuzz/fixture.hpp"
#include "qkv/nn/safetensors.hpp"

namespace {

using qkv::StateDict;
using Json = nlohmann::ordered_json;

// A safetensors file from its header and data.
std::string file_of(const Json& header, std::string_view data) {
  const std::string json = header.dump();
  std::string bytes(8, '\0');
  const std::uint64_t n = json.size();
  std::memcpy(bytes.data(), &n, 8);
  return bytes + json + std::string(data);
}

// `valid` with its header changed by `edit`, and the same data.
std::string edited(const std::string& valid, const std::function<void(Json&)>& edit) {
  std::uint64_t n;
  std::memcpy(&n, valid.data(), 8);
  Json header = Json::parse(valid.substr(8, n));
  edit(header);
  return file_of(header, std::string_view(valid).substr(8 + n));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: qkv_fuzz_corpus DIR\n";
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  const auto put = [&](const std::string& name, std::string_view bytes) {
    qkv::nn::write_atomically((dir / name).string(), bytes);
  };
  const qkv::fuzz::Fixture run;
  const std::string& model = run.model_file;
  const std::string& optimizer = run.optimizer_file;
  const StateDict state = run.model->state_dict();

  put("config.json", run.config);
  put("model.safetensors", model);
  put("optimizer.safetensors", optimizer);

  // Files that are not safetensors at all.
  put("empty", "");
  put("truncated-header", model.substr(0, 5));
  put("truncated-json", model.substr(0, 40));
  put("truncated-data", model.substr(0, model.size() - 3));
  std::string too_long = model;
  const std::uint64_t huge = std::uint64_t(1) << 40;
  std::memcpy(too_long.data(), &huge, 8);
  put("header-too-long", too_long);
  put("header-not-json", file_of(Json(), "").replace(8, 4, "{\"a\""));
  put("header-not-object", file_of(Json::array({1, 2}), ""));

  // Header entries that do not describe the data.
  const std::string first = state.front().first;
  put("dtype-unknown", edited(model, [&](Json& h) { h[first]["dtype"] = "F17"; }));
  put("dtype-unsupported", edited(model, [&](Json& h) { h[first]["dtype"] = "I32"; }));
  put("dtype-missing", edited(model, [&](Json& h) { h[first].erase("dtype"); }));
  put("shape-not-sizes", edited(model, [&](Json& h) { h[first]["shape"] = Json::array({-1, "2"}); }));
  put("shape-not-whole", edited(model, [&](Json& h) { h[first]["shape"] = Json::array({2.0, 4}); }));
  put("shape-nested", edited(model, [&](Json& h) {
        Json deep = Json::array({2});
        for (int i = 0; i < 40; ++i) deep = Json::array({deep});
        h[first]["shape"] = deep;
      }));
  put("shape-size-mismatch", edited(model, [&](Json& h) { h[first]["shape"][0] = 1000; }));
  put("shape-overflow", edited(model, [&](Json& h) {
        h[first]["shape"] = Json::array({std::uint64_t(1) << 62, 64});
      }));
  put("offsets-outside", edited(model, [&](Json& h) { h[first]["data_offsets"][1] = 1 << 30; }));
  put("offsets-reversed", edited(model, [&](Json& h) {
        h[first]["data_offsets"] = Json::array({h[first]["data_offsets"][1], h[first]["data_offsets"][0]});
      }));
  put("offsets-overlap", edited(model, [&](Json& h) {
        // The second tensor starts 4 bytes before the first one ends.
        auto& offsets = h[state[1].first]["data_offsets"];
        offsets = Json::array({offsets[0].get<std::uint64_t>() - 4, offsets[1].get<std::uint64_t>() - 4});
      }));
  put("metadata-not-strings", edited(model, [&](Json& h) { h["__metadata__"]["step"] = 1; }));

  // Valid files whose contents do not fit the run.
  StateDict with_nan = state;
  with_nan.front().second = with_nan.front().second.detach().to(with_nan.front().second.dtype());
  with_nan.front().second.mutable_value<float>().flat(0) = std::numeric_limits<float>::quiet_NaN();
  put("weight-nan", qkv::nn::serialize_safetensors(with_nan, {{"step", "1"}}));
  put("tensor-missing", qkv::nn::serialize_safetensors(StateDict(state.begin() + 1, state.end()), {{"step", "1"}}));
  StateDict extra = state;
  extra.emplace_back("blocks.7.attn.q_proj.weight", state.front().second);
  put("tensor-unexpected", qkv::nn::serialize_safetensors(extra, {{"step", "1"}}));
  put("tensor-float64", qkv::nn::serialize_safetensors(
                            [&] {
                              StateDict s = state;
                              s.front().second = s.front().second.to(qkv::DType::float64);
                              return s;
                            }(),
                            {{"step", "1"}}));
  put("step-missing", edited(model, [&](Json& h) { h.erase("__metadata__"); }));
  put("step-not-number", edited(model, [&](Json& h) { h["__metadata__"]["step"] = "1x"; }));
  put("step-other", edited(model, [&](Json& h) { h["__metadata__"]["step"] = "2"; }));
  put("rng-short", edited(optimizer, [&](Json& h) { h["__metadata__"]["rng"] = "1 2 3"; }));
  StateDict negative_step = run.optimizer->state_dict();
  for (auto& [name, t] : negative_step)
    if (name == "0.step") t = qkv::scalar(-1.0, qkv::DType::float64);
  put("optimizer-step-negative",
      qkv::nn::serialize_safetensors(negative_step, {{"step", "1"}, {"rng", "1 2 3 4"}}));
  // Adam's state of one parameter: one buffer gone, or all of it.
  const auto without = [&](const std::function<bool(const std::string&)>& drop) {
    StateDict kept;
    for (const auto& [name, t] : run.optimizer->state_dict())
      if (!drop(name)) kept.emplace_back(name, t);
    return qkv::nn::serialize_safetensors(kept, {{"step", "1"}, {"rng", "1 2 3 4"}});
  };
  put("optimizer-buffer-missing", without([](const std::string& name) { return name == "3.exp_avg_sq"; }));
  put("optimizer-state-missing", without([](const std::string& name) { return name.rfind("3.", 0) == 0; }));
  // Files that load but hold no state a run reaches: a generator's state that is not four 64-bit
  // words or is all zeros, Adam's average of squares negative or its average not finite.
  put("rng-long", edited(optimizer, [&](Json& h) { h["__metadata__"]["rng"] = "1 2 3 4 5"; }));
  put("rng-negative", edited(optimizer, [&](Json& h) { h["__metadata__"]["rng"] = "-1 -1 -1 -1"; }));
  put("rng-zero", edited(optimizer, [&](Json& h) { h["__metadata__"]["rng"] = "0 0 0 0"; }));
  // The step a run's target checks passed: after the checkpoint's own step (1), or not a step.
  put("target-later", edited(optimizer, [&](Json& h) { h["__metadata__"]["steps_to_target"] = "2"; }));
  put("target-text", edited(optimizer, [&](Json& h) { h["__metadata__"]["steps_to_target"] = "1e3"; }));
  // A long text with a newline and a quote: the message shows its start, escaped, and its length.
  put("rng-text", edited(optimizer, [&](Json& h) { h["__metadata__"]["rng"] = "1\n2 \"3\" " + std::string(10'000, 'x'); }));
  const auto with_value = [&](const std::string& buffer, float value) {
    StateDict changed = run.optimizer->state_dict();
    for (auto& [name, t] : changed)
      if (name == buffer) {
        t = t.detach().to(t.dtype());
        t.mutable_value<float>().flat(1) = value;
      }
    return qkv::nn::serialize_safetensors(changed, {{"step", "1"}, {"rng", "1 2 3 4"}});
  };
  put("optimizer-exp-avg-sq-negative", with_value("2.exp_avg_sq", -0.5f));
  put("optimizer-exp-avg-inf", with_value("2.exp_avg", std::numeric_limits<float>::infinity()));

  // snapshots.jsonl: the fuzz run's snapshot, and lines whose sizes are not the run's.
  const auto task = qkv::tasks::make_task(run.options.task);
  const Json snapshot = qkv::report::Snapshots(run.options, *task).take(1, *run.model);
  put("snapshots.jsonl", snapshot.dump() + "\n");
  const auto snapshot_with = [&](const std::function<void(Json&)>& edit) {
    Json line = snapshot;
    edit(line);
    return snapshot.dump() + "\n" + line.dump() + "\n";
  };
  put("snapshots-layers-null", snapshot_with([](Json& j) { j["layers"] = nullptr; }));
  put("snapshots-heads-null", snapshot_with([](Json& j) { j["layers"][0]["heads"] = nullptr; }));
  put("snapshots-heads-many", snapshot_with([](Json& j) {
        j["layers"][0]["heads"] = Json::array();
        for (int h = 0; h < 1000; ++h) j["layers"][0]["heads"].push_back(Json::object());
      }));
  put("snapshots-composition-negative", snapshot_with([](Json& j) {
        j["composition"] = Json::array({{{"from_layer", -1}, {"from_head", 0}, {"to_layer", 0}, {"to_head", 0},
                                         {"q", 0}, {"k", 0}, {"v", 0}}});
      }));
  put("snapshots-input-float", snapshot_with([](Json& j) { j["input"][0] = 1e300; }));
  put("snapshots-step-float", snapshot_with([](Json& j) { j["step"] = 1e300; }));

  // config.json files qkv does not write.
  put("config-not-json", run.config.substr(0, run.config.size() / 2));
  std::string other_task = run.config;
  other_task.replace(other_task.find("brackets"), 8, "sorting!");
  put("config-unknown-task", other_task);
  std::string wrong_type = run.config;
  wrong_type.replace(wrong_type.find("\"causal\": true"), 14, "\"causal\": 1   ");
  put("config-wrong-type", wrong_type);
  const auto config_with = [&](const std::string& field, const std::string& value) {
    std::string text = run.config;
    const std::size_t at = text.find("\"" + field + "\": ");
    const std::size_t begin = at + field.size() + 4, end = text.find_first_of(",\n", begin);
    return text.replace(begin, end - begin, value);
  };
  put("config-batch-zero", config_with("batch", "0"));
  put("config-batch-huge", config_with("batch", "18446744073709551615"));
  put("config-warmup-float", config_with("warmup", "1e300"));
  put("config-d-model-negative", config_with("d_model", "-16"));
  put("config-lr-zero", config_with("lr", "0"));
  put("config-vocab-other", config_with("vocab_size", "3"));
  std::string other_tokens = run.config;
  other_tokens.replace(other_tokens.find("\"(\","), 4, "\"{\",");
  put("config-tokens-other", other_tokens);
  put("config-nested", config_with("seed", std::string(30, '[') + std::string(30, ']')));
  std::cout << "wrote the corpus to " << dir.string() << "\n";
}
