// libFuzzer target for the checkpoint loader and the training history. Each input is tried as
// each of a run folder's files, with the others valid: as config.json, as model.safetensors and
// as optimizer.safetensors (loaded into the model and Adam, its metadata read), and as
// metrics.jsonl and snapshots.jsonl (read against the run's config). A bad file must end in a std::runtime_error; any other exception, a
// crash, a sanitizer report, a hang or a huge allocation is a bug.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string_view>

#include "qkv/training/checkpoint.hpp"
#include "qkv/analysis/history.hpp"
#include "qkv/report/snapshots.hpp"
#include "fuzz/fixture.hpp"
#include "qkv/training/options.hpp"

namespace {

template <class F>
void expect_success_or_runtime_error(F f) {
  try {
    f();
  } catch (const std::runtime_error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace qkv;
  static const fuzz::Fixture run;
  static const nn::Safetensors model_file = nn::parse_safetensors(run.model_file, "fuzz/model.safetensors");
  static const nn::Safetensors optimizer_file = nn::parse_safetensors(run.optimizer_file, "fuzz/optimizer.safetensors");
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);

  expect_success_or_runtime_error([&] { training::parse_config(bytes, "fuzz/config.json"); });
  expect_success_or_runtime_error([&] { analysis::parse_history(bytes, "", run.options.model, "fuzz"); });
  expect_success_or_runtime_error([&] { analysis::parse_history("", bytes, run.options.model, "fuzz"); });
  expect_success_or_runtime_error([&] {
    const nn::Safetensors file = nn::parse_safetensors(bytes, "fuzz/input.safetensors");
    expect_success_or_runtime_error(
        [&] { training::restore_checkpoint(nn::parse_checkpoint("fuzz", file, optimizer_file), *run.model, *run.optimizer, run.check); });
    expect_success_or_runtime_error(
        [&] { training::restore_checkpoint(nn::parse_checkpoint("fuzz", model_file, file), *run.model, *run.optimizer, run.check); });
  });
  return 0;
}
