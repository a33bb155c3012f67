#include "examples/cli/checkpoint.hpp"

#include <algorithm>
#include <filesystem>
#include <ostream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "qkv/nn/checkpoint.hpp"

namespace qkv::cli {

namespace {

std::string metadata(const nn::Safetensors& f, const std::string& file, const std::string& key) {
  const auto it = f.metadata.find(key);
  if (it == f.metadata.end()) throw std::runtime_error(fmt::format("{}: no '{}' in its metadata", file, key));
  return it->second;
}

std::size_t parse_step(const std::string& file, const std::string& text) {
  if (const auto step = parse_count(text)) return *step;
  throw std::runtime_error(fmt::format("{}: step '{}' is not a number", file, text));
}

CheckpointState load_folder(const std::string& folder, nn::Module& model, optim::Optimizer& optimizer,
                            const CheckpointCheck& check) {
  const CheckpointState state =
      restore_checkpoint(folder, nn::load_safetensors(folder + "/model.safetensors"),
                         nn::load_safetensors(folder + "/optimizer.safetensors"), model, optimizer, check);
  const auto named = nn::checkpoint_step(folder);  // none for an older run's files directly in its folder
  if (named && *named != state.step)
    throw std::runtime_error(fmt::format("{}: its files are from step {}", folder, state.step));
  return state;
}

}  // namespace

void save_checkpoint(const std::string& dir, const nn::Module& model, const optim::Optimizer& optimizer,
                     const CheckpointState& state) {
  const std::string step = std::to_string(state.step);
  const auto& r = state.rng;
  nn::commit_checkpoint(
      dir, state.step,
      {{"model.safetensors", nn::serialize_safetensors(model.state_dict(), {{"step", step}}, dir + "/model.safetensors")},
       {"optimizer.safetensors",
        nn::serialize_safetensors(optimizer.state_dict(),
                                  {{"step", step}, {"rng", fmt::format("{} {} {} {}", r[0], r[1], r[2], r[3])}},
                                  dir + "/optimizer.safetensors")}});
}

CheckpointState load_checkpoint(const std::string& dir, nn::Module& model, optim::Optimizer& optimizer,
                                const CheckpointCheck& check) {
  const auto folder = nn::committed_checkpoint(dir);
  if (!folder) throw std::runtime_error(fmt::format("{}: the run has no checkpoint yet", dir));
  return load_folder(*folder, model, optimizer, check);
}

std::optional<CheckpointState> resume_checkpoint(const std::string& dir, nn::Module& model, optim::Optimizer& optimizer,
                                                 const CheckpointCheck& check, std::ostream& notes) {
  // The committed checkpoint, then the older ones, newest first. Newer ones were never committed.
  std::vector<std::string> candidates;
  const auto committed = nn::committed_checkpoint(dir);
  if (committed) candidates.push_back(*committed);
  const auto committed_step = committed ? nn::checkpoint_step(*committed) : std::nullopt;
  for (const auto& [step, folder] : nn::checkpoint_folders(dir))
    if (!committed || (committed_step && step < *committed_step)) candidates.push_back(folder);
  std::vector<std::string> faults;
  for (const std::string& folder : candidates) {
    try {
      const CheckpointState state = load_folder(folder, model, optimizer, check);
      if (!faults.empty()) {
        notes << fmt::format("qkv train: resuming from {} (step {}), the newest checkpoint that loads; passed over:\n",
                             folder, state.step);
        for (const std::string& fault : faults) notes << "  " << fault << "\n";
        if (const auto step = nn::checkpoint_step(folder)) nn::recommit_checkpoint(dir, *step);
      }
      return state;
    } catch (const std::runtime_error& e) {
      faults.push_back(e.what());
    }
  }
  if (faults.empty()) return std::nullopt;
  std::string all;
  for (const std::string& fault : faults) all += "\n  " + fault;
  throw std::runtime_error(fmt::format("{}: no checkpoint loads:{}", dir, all));
}

CheckpointState restore_checkpoint(const std::string& folder, const nn::Safetensors& m, const nn::Safetensors& o,
                                   nn::Module& model, optim::Optimizer& optimizer, const CheckpointCheck& check) {
  const std::string model_file = folder + "/model.safetensors", optimizer_file = folder + "/optimizer.safetensors";
  CheckpointState state;
  state.step = parse_step(model_file, metadata(m, model_file, "step"));
  const std::size_t optimizer_step = parse_step(optimizer_file, metadata(o, optimizer_file, "step"));
  if (optimizer_step != state.step)
    throw std::runtime_error(fmt::format("{}: the model is from step {} but the optimizer from step {}", folder,
                                         state.step, optimizer_step));
  if (state.step > check.max_step)
    throw std::runtime_error(
        fmt::format("{}: step {} is past the run's {} steps", model_file, state.step, check.max_step));
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
