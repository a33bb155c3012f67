// The checkpoint fuzzer's seed corpus, run through the loader the way the fuzzer runs each input:
// the valid files load, and each broken file is rejected with a std::runtime_error naming the
// file and its fault.
#include "tests/helpers.hpp"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "qkv/training/checkpoint.hpp"
#include "qkv/analysis/history.hpp"
#include "qkv/report/snapshots.hpp"
#include "fuzz/fixture.hpp"
#include "qkv/training/options.hpp"

using namespace qkv;
using Catch::Matchers::Contains;

namespace {

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// What the loader says about `bytes` as the file `role` of a run folder whose other files are
// those of `run`: "" when it loads.
std::string verdict(const fuzz::Fixture& run, const std::string& role, const std::string& bytes) {
  try {
    if (role == "config.json") {
      training::parse_config(bytes, "fuzz/config.json");
    } else if (role == "snapshots.jsonl") {
      analysis::parse_history("", bytes, run.options.model, "fuzz");
    } else {
      const nn::Safetensors file = nn::parse_safetensors(bytes, "fuzz/" + role);
      const nn::Safetensors model = role == "model.safetensors" ? file : nn::parse_safetensors(run.model_file, "m");
      const nn::Safetensors optimizer =
          role == "optimizer.safetensors" ? file : nn::parse_safetensors(run.optimizer_file, "o");
      training::restore_checkpoint(nn::parse_checkpoint("fuzz", model, optimizer), *run.model, *run.optimizer, run.check);
    }
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("every file of the fuzz corpus loads, or is rejected naming its fault") {
  const fuzz::Fixture run;
  // file → (its role in the run folder, what the error says; "" when it loads)
  const std::map<std::string, std::pair<std::string, std::string>> expected = {
      {"config.json", {"config.json", ""}},
      {"model.safetensors", {"model.safetensors", ""}},
      {"optimizer.safetensors", {"optimizer.safetensors", ""}},
      {"tensor-float64", {"model.safetensors", ""}},  // converted on load, as in PyTorch
      {"empty", {"model.safetensors", "fuzz/model.safetensors: empty or truncated: 0 bytes"}},
      {"truncated-header", {"model.safetensors", "empty or truncated: 5 bytes"}},
      {"truncated-json", {"model.safetensors", "is larger than the 32 bytes that follow it"}},
      {"truncated-data", {"model.safetensors", "lie outside the"}},
      {"header-too-long", {"model.safetensors", "header length 1099511627776 is larger than the"}},
      {"header-not-json", {"model.safetensors", "fuzz/model.safetensors (its header): invalid JSON"}},
      {"header-not-object", {"model.safetensors", "the JSON header is not an object"}},
      {"dtype-unknown", {"model.safetensors", "unknown dtype 'F17'"}},
      {"dtype-unsupported", {"model.safetensors", "dtype I32 is not supported"}},
      {"dtype-missing", {"model.safetensors", "no dtype string"}},
      {"shape-not-sizes", {"model.safetensors", "shape entry 0 is a number, not a size"}},
      {"shape-not-whole", {"model.safetensors", "shape entry 0 is a number, not a size"}},
      {"shape-nested", {"model.safetensors", "JSON nested more than 3 levels deep"}},
      {"shape-size-mismatch", {"model.safetensors", "but data_offsets span"}},
      {"shape-overflow", {"model.safetensors", "needs more than 2^64 bytes"}},
      {"offsets-outside", {"model.safetensors", "lie outside the"}},
      {"offsets-reversed", {"model.safetensors", "lie outside the"}},
      {"offsets-overlap", {"model.safetensors", "overlaps tensor"}},
      {"metadata-not-strings", {"model.safetensors", "__metadata__ 'step' is not a string"}},
      {"weight-nan", {"model.safetensors", "holds nan at flat index 0"}},
      {"tensor-missing", {"model.safetensors", "load_state_dict: missing tok.weight"}},
      {"tensor-unexpected", {"model.safetensors", "load_state_dict: unexpected blocks.7.attn.q_proj.weight"}},
      {"step-missing", {"model.safetensors", "fuzz/model.safetensors: no 'step' in its metadata"}},
      {"step-not-number", {"model.safetensors", "step '1x' is not a number"}},
      {"step-other", {"model.safetensors", "the model is from step 2 but the optimizer from step 1"}},
      {"rng-short", {"optimizer.safetensors", "fuzz/optimizer.safetensors: 'rng' = \"1 2 3\" is 3 words, not 4 numbers"}},
      {"rng-long", {"optimizer.safetensors", "fuzz/optimizer.safetensors: 'rng' = \"1 2 3 4 5\" is 5 words, not 4 numbers"}},
      {"rng-negative", {"optimizer.safetensors", "holds \"-1\", not an unsigned 64-bit number"}},
      {"rng-text",
       {"optimizer.safetensors", "fuzz/optimizer.safetensors: 'rng' = \"1\\n2 \\\"3\\\" " + std::string(56, 'x') +
                                     "\"… (10008 bytes) holds \"\\\"3\\\"\", not an unsigned 64-bit number"}},
      {"rng-zero", {"optimizer.safetensors", "fuzz/optimizer.safetensors: 'rng' = \"0 0 0 0\" is all zeros"}},
      {"target-later", {"optimizer.safetensors",
                        "fuzz/optimizer.safetensors: 'steps_to_target' = \"2\" is not a step from 1 to the checkpoint's 1"}},
      {"target-text", {"optimizer.safetensors", "'steps_to_target' = \"1e3\" is not a step from 1"}},
      {"optimizer-exp-avg-sq-negative",
       {"optimizer.safetensors", "fuzz/optimizer.safetensors: Optimizer::load_state_dict: '2.exp_avg_sq' holds -0.5 at "
                                 "element 1, but an average of squares cannot be negative"}},
      {"optimizer-exp-avg-inf", {"optimizer.safetensors", "fuzz/optimizer.safetensors: tensor '2.exp_avg' holds inf at flat index 1"}},
      {"snapshots.jsonl", {"snapshots.jsonl", ""}},
      {"snapshots-layers-null", {"snapshots.jsonl", "fuzz/snapshots.jsonl (line 2): 'layers' is not an array"}},
      {"snapshots-heads-null", {"snapshots.jsonl", "(line 2): 'heads' is not an array, where the run's config.json has 1"}},
      {"snapshots-heads-many", {"snapshots.jsonl", "(line 2): 'heads' is 1000 entries, where the run's config.json has 1"}},
      {"snapshots-composition-negative", {"snapshots.jsonl", "(line 2): 'composition' is not an array of at most 0 pairs"}},
      {"snapshots-input-float", {"snapshots.jsonl", "(line 2): 'input'[0] is 1e+300, not a whole number"}},
      {"snapshots-step-float", {"snapshots.jsonl", "(line 2): 'step' is 1e+300, not a whole number"}},
      {"optimizer-step-negative", {"optimizer.safetensors", "'0.step' = -1 is not a step count"}},
      {"optimizer-buffer-missing", {"optimizer.safetensors", "parameter 3 has a step count but no '3.exp_avg_sq'"}},
      {"optimizer-state-missing", {"optimizer.safetensors", "parameter 3 has no state after 1 steps of training"}},
      {"config-not-json", {"config.json", "fuzz/config.json: invalid JSON"}},
      {"config-unknown-task", {"config.json", "'task' is 'sorting!'; it must be one of brackets, rps, induction"}},
      {"config-wrong-type", {"config.json", "'model.causal' must be true or false, not a number"}},
      {"config-batch-zero", {"config.json", "fuzz/config.json: 'batch' is 0, a full batch, but the brackets task draws its sequences"}},
      {"config-batch-huge", {"config.json", "'batch' is 18446744073709551615, out of range"}},
      {"config-warmup-float", {"config.json", "'warmup' must be a whole number in [0, 1000000000], not 1e+300"}},
      {"config-d-model-negative", {"config.json", "'model.d_model' is -16, out of range [1, 1000000]"}},
      {"config-lr-zero", {"config.json", "'lr' is 0; it must be in (0, 10]"}},
      {"config-vocab-other", {"config.json", "'model.vocab_size' is 3, but the brackets task has"}},
      {"config-tokens-other", {"config.json", "fuzz/config.json: 'tokens' are not the brackets task's tokens"}},
      {"config-nested", {"config.json", "fuzz/config.json: JSON nested more than 3 levels deep"}},
  };
  std::set<std::string> seen;
  for (const auto& entry : std::filesystem::directory_iterator(QKV_FUZZ_CORPUS)) {
    const std::string name = entry.path().filename().string();
    INFO(name);
    seen.insert(name);
    const auto it = expected.find(name);
    REQUIRE(it != expected.end());  // a new corpus file needs its expected verdict here
    const auto& [role, message] = it->second;
    const std::string got = verdict(run, role, read(entry.path()));
    if (message.empty())
      CHECK(got == "");
    else
      CHECK_THAT(got, Contains(message));
  }
  CHECK(seen.size() == expected.size());
}

TEST_CASE("the committed fuzz corpus is what qkv_fuzz_corpus writes today") {
  // The fixture's valid files, byte for byte: a change to the model or the file format shows here.
  const fuzz::Fixture run;
  CHECK(read(std::filesystem::path(QKV_FUZZ_CORPUS) / "config.json") == run.config);
  CHECK(read(std::filesystem::path(QKV_FUZZ_CORPUS) / "model.safetensors") == run.model_file);
  CHECK(read(std::filesystem::path(QKV_FUZZ_CORPUS) / "optimizer.safetensors") == run.optimizer_file);
}
