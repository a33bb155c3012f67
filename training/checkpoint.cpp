#include "qkv/training/checkpoint.hpp"

#include <algorithm>
#include <iterator>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "qkv/core/shape.hpp"

namespace qkv::training {

namespace {

// A metadata text as an error shows it: its first 64 bytes, quoted and escaped (a newline as \n,
// a byte that is no UTF-8 as U+FFFD), and the length of a longer one.
std::string shown(const std::string& text) {
  constexpr std::size_t shown_bytes = 64;
  const std::string quoted =
      nlohmann::json(text.substr(0, shown_bytes)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return text.size() > shown_bytes ? fmt::format("{}… ({} bytes)", quoted, text.size()) : quoted;
}

}  // namespace

void save_checkpoint(const std::string& dir, const nn::Module& model, const optim::Optimizer& optimizer,
                     const CheckpointState& state) {
  const auto& r = state.rng;
  nn::CheckpointInfo info{.step = state.step, .metadata = {{"rng", fmt::format("{} {} {} {}", r[0], r[1], r[2], r[3])}}};
  if (state.steps_to_target) info.metadata["steps_to_target"] = std::to_string(*state.steps_to_target);
  nn::save_checkpoint(dir, model, optimizer.state_dict(), info);
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
  // Four unsigned 64-bit words, not all zero (xoshiro256**'s one invalid state), and nothing else.
  std::istringstream rng(rng_text->second);
  std::vector<std::string> words{std::istream_iterator<std::string>(rng), std::istream_iterator<std::string>()};
  const auto bad_rng = [&](const std::string& why) {
    return std::runtime_error(fmt::format("{}: 'rng' = {} {}", optimizer_file, shown(rng_text->second), why));
  };
  if (words.size() != state.rng.size()) throw bad_rng(fmt::format("is {} words, not 4 numbers", words.size()));
  for (std::size_t i = 0; i < words.size(); ++i) {
    const auto word = parse_count(words[i]);
    if (!word) throw bad_rng(fmt::format("holds {}, not an unsigned 64-bit number", shown(words[i])));
    state.rng[i] = *word;
  }
  if (state.rng == Generator::State{}) throw bad_rng("is all zeros, which no generator reaches");
  if (const auto target = c.info.metadata.find("steps_to_target"); target != c.info.metadata.end()) {
    const auto reached = parse_count(target->second);
    if (!reached || *reached == 0 || *reached > state.step)
      throw std::runtime_error(fmt::format("{}: 'steps_to_target' = {} is not a step from 1 to the checkpoint's {}",
                                           optimizer_file, shown(target->second), state.step));
    state.steps_to_target = *reached;
  }
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

}  // namespace qkv::training
