#include "qkv/training/kept_checkpoints.hpp"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <regex>

#include <fmt/format.h>

#include "qkv/nn/safetensors.hpp"
#include "qkv/training/options.hpp"

namespace qkv::training {

namespace fs = std::filesystem;

namespace {

// The log schedule's steps up to `last`: round(10^(i/10)) from i = 10, each once.
std::vector<std::size_t> log_steps(std::size_t last) {
  std::vector<std::size_t> steps;
  for (int i = 10;; ++i) {
    const auto step = std::size_t(std::llround(std::pow(10.0, i / 10.0)));
    if (step > last) return steps;
    if (steps.empty() || steps.back() != step) steps.push_back(step);
  }
}

const std::regex kept_name(R"(step-(\d{8,})\.safetensors)");

}  // namespace

bool KeepSchedule::due(std::size_t step, std::size_t last) const {
  if (step == 0 || step == last) return true;
  if (every && step % every == 0) return true;
  if (!log) return false;
  const auto steps = log_steps(step);
  return !steps.empty() && steps.back() == step;
}

std::vector<std::size_t> KeepSchedule::steps(std::size_t last) const {
  std::vector<std::size_t> kept{0};
  if (log) {
    for (const std::size_t s : log_steps(last))
      if (s < last) kept.push_back(s);
  } else if (every) {
    for (std::size_t s = every; s < last; s += every) kept.push_back(s);
  }
  kept.push_back(last);
  return kept;
}

std::optional<KeepSchedule> keep_schedule(const std::string& text) {
  if (text.empty()) return std::nullopt;
  if (text == "log") return KeepSchedule{.log = true};
  if (text.starts_with("every:")) {
    const std::string n = text.substr(6);
    std::size_t every = 0;
    const auto [end, error] = std::from_chars(n.data(), n.data() + n.size(), every);
    if (error == std::errc() && end == n.data() + n.size() && every >= 1 && every <= tasks::max_steps)
      return KeepSchedule{.every = every};
  }
  throw OptionError("keep_checkpoints",
                    fmt::format("is '{}': it must be log or every:N with N from 1 to {}", text, tasks::max_steps));
}

void check_kept_checkpoints(const tasks::TrainOptions& o) {
  const auto schedule = keep_schedule(o.keep_checkpoints);
  if (!schedule) return;
  // Counted without listing them: every:1 over a billion steps must be refused, not enumerated.
  const double count = schedule->log ? double(schedule->steps(o.steps).size())
                                     : 2.0 + double((o.steps - 1) / schedule->every);
  const double bytes = count * nn::parameter_count(o.model) * double(dtype_size(o.model.dtype));
  if (count > double(max_kept_checkpoints) || bytes > max_kept_bytes)
    throw OptionError("keep_checkpoints",
                      fmt::format("is {}: over {} steps it keeps {:.0f} checkpoints of the model's weights, {:.1f} MB; at "
                                  "most {} checkpoints and {:.0f} MB are kept",
                                  o.keep_checkpoints, o.steps, count, bytes / 1e6, max_kept_checkpoints, max_kept_bytes / 1e6));
}

std::string kept_checkpoint_path(const std::string& dir, std::size_t step) {
  return fmt::format("{}/checkpoints/step-{:08d}.safetensors", dir, step);
}

void keep_checkpoint(const std::string& dir, std::size_t step, const nn::Module& model) {
  fs::create_directories(dir + "/checkpoints");
  nn::save_safetensors(kept_checkpoint_path(dir, step), model.state_dict(), {{"step", std::to_string(step)}});
}

void remove_partial_kept(const std::string& dir) {
  const fs::path folder = fs::path(dir) / "checkpoints";
  if (!fs::is_directory(folder)) return;
  for (const auto& entry : fs::directory_iterator(folder)) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(".tmp") && std::regex_match(name.substr(0, name.size() - 4), kept_name)) fs::remove(entry.path());
  }
}

std::vector<std::pair<std::size_t, std::string>> kept_checkpoints(const std::string& dir) {
  std::vector<std::pair<std::size_t, std::string>> kept;
  const fs::path folder = fs::path(dir) / "checkpoints";
  if (!fs::is_directory(folder)) return kept;
  for (const auto& entry : fs::directory_iterator(folder)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && std::regex_match(name, m, kept_name))
      kept.emplace_back(std::stoull(m[1].str()), entry.path().string());
  }
  std::sort(kept.begin(), kept.end());
  return kept;
}

}  // namespace qkv::training
