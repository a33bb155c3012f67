#include "examples/cli/checkpoint.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

namespace qkv::cli {

void save_checkpoint(const std::string& dir, const nn::Module& model, const optim::Optimizer& optimizer,
                     const CheckpointState& state) {
  const auto& r = state.rng;
  nn::save_checkpoint(dir, model, optimizer.state_dict(),
                      {.step = state.step, .metadata = {{"rng", fmt::format("{} {} {} {}", r[0], r[1], r[2], r[3])}}});
}

CheckpointState restore_checkpoint(const nn::Checkpoint& c, nn::Module& model, optim::Optimizer& optimizer,
                                   const CheckpointCheck& check) {
  const std::string model_file = c.folder + "/model.safetensors", optimizer_file = c.folder + "/optimizer.safetensors";
  CheckpointState state;
  state.step = c.info.step;
  if (state.step > check.max_step)
    throw std::runtime_error(
        fmt::format("{}: step {} is past the run's {} steps", model_file, state.step, check.max_step));
  const auto rng_text = c.info.metadata.find("rng");
  if (rng_text == c.info.metadata.end())
    throw std::runtime_error(fmt::format("{}: no 'rng' in its metadata", optimizer_file));
  std::istringstream rng(rng_text->second);
  for (auto& word : state.rng)
    if (!(rng >> word)) throw std::runtime_error(fmt::format("{}: 'rng' is not four numbers", optimizer_file));
  nn::load_weights(c, model);
  try {
    optimizer.load_state_dict(c.optimizer.tensors);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(fmt::format("{}: {}", optimizer_file, e.what()));
  }
  // Each parameter a step updates has state from step 1 on, counting the run's steps; no other has.
  const StateDict saved = optimizer.state_dict();
  for (std::size_t i = 0; i < check.updated.size(); ++i) {
    const std::string key = fmt::format("{}.step", i);
    const auto it = std::find_if(saved.begin(), saved.end(), [&](const auto& entry) { return entry.first == key; });
    const double steps = it == saved.end() ? 0.0 : it->second.item();
    const double expected = check.updated[i] && state.step > 0 ? double(state.step) : 0.0;
    if (steps != expected)
      throw std::runtime_error(fmt::format("{}: parameter {} has {} after {} steps of training, not {}", optimizer_file,
                                           i, steps == 0 ? "no state" : fmt::format("the state of {} steps", steps),
                                           state.step, expected == 0 ? "no state" : fmt::format("the state of {} steps", expected)));
  }
  return state;
}

}  // namespace qkv::cli
