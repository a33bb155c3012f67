#include "examples/checkpoint.hpp"

#include <sstream>
#include <stdexcept>

#include <fmt/format.h>


namespace qkv::examples {

namespace {

std::string metadata(const nn::Safetensors& f, const std::string& file, const std::string& key) {
  const auto it = f.metadata.find(key);
  if (it == f.metadata.end()) throw std::runtime_error(fmt::format("{}: no '{}' in its metadata", file, key));
  return it->second;
}

std::size_t parse_step(const std::string& file, const std::string& text) {
  std::size_t used = 0;
  try {
    const std::size_t step = std::stoull(text, &used);
    if (used == text.size()) return step;
  } catch (const std::exception&) {
  }
  throw std::runtime_error(fmt::format("{}: step '{}' is not a number", file, text));
}

}  // namespace

void save_checkpoint(const std::string& dir, const nn::Module& model, const optim::Optimizer& optimizer,
                     const CheckpointState& state) {
  const std::string step = std::to_string(state.step);
  nn::save_safetensors(dir + "/model.safetensors", model.state_dict(), {{"step", step}});
  const auto& r = state.rng;
  nn::save_safetensors(dir + "/optimizer.safetensors", optimizer.state_dict(),
                       {{"step", step}, {"rng", fmt::format("{} {} {} {}", r[0], r[1], r[2], r[3])}});
}

CheckpointState load_checkpoint(const std::string& dir, nn::Module& model, optim::Optimizer& optimizer) {
  return restore_checkpoint(dir, nn::load_safetensors(dir + "/model.safetensors"),
                            nn::load_safetensors(dir + "/optimizer.safetensors"), model, optimizer);
}

CheckpointState restore_checkpoint(const std::string& dir, const nn::Safetensors& m, const nn::Safetensors& o,
                                   nn::Module& model, optim::Optimizer& optimizer) {
  const std::string model_file = dir + "/model.safetensors", optimizer_file = dir + "/optimizer.safetensors";
  CheckpointState state;
  state.step = parse_step(model_file, metadata(m, model_file, "step"));
  const std::size_t optimizer_step = parse_step(optimizer_file, metadata(o, optimizer_file, "step"));
  if (optimizer_step != state.step)
    throw std::runtime_error(fmt::format("{}: the model is from step {} but the optimizer from step {}", dir, state.step,
                                         optimizer_step));
  std::istringstream rng(metadata(o, optimizer_file, "rng"));
  for (auto& word : state.rng)
    if (!(rng >> word)) throw std::runtime_error(fmt::format("{}: 'rng' is not four numbers", optimizer_file));
  try {
    model.load_state_dict(m.tensors);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(fmt::format("{}: {}", model_file, e.what()));
  }
  try {
    optimizer.load_state_dict(o.tensors);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(fmt::format("{}: {}", optimizer_file, e.what()));
  }
  return state;
}

}  // namespace qkv::examples
