#include "qkv/tasks/vocabulary_task.hpp"

#include <algorithm>
#include <sstream>

#include "qkv/core/shape.hpp"

namespace qkv::tasks {

VocabularyTask::VocabularyTask(std::string name, const nn::TransformerConfig& model, std::vector<std::string> names)
    : names_(std::move(names)) {
  if (!names_.empty() && names_.size() != model.vocab_size)
    fail(name, "{} token names for a vocabulary of {}", names_.size(), model.vocab_size);
  info_ = {.name = std::move(name),
           .description = "a run's own task, known by its model's vocabulary",
           .vocab_size = model.vocab_size,
           .n_classes = model.readout == nn::Readout::token ? model.n_classes : 0,
           .max_len = model.max_len,
           .readout = model.readout,
           .causal = model.causal,
           .draws = false};
}

Batch VocabularyTask::sample(std::size_t, Generator&) const {
  fail(info_.name, "a task known only by its vocabulary has no sequences to draw: give the tokens to inspect, or "
                   "score the model with its own task (tasks::evaluate)");
}

std::string VocabularyTask::decode(const std::vector<std::int64_t>& tokens) const { return names_text(*this, tokens); }

std::vector<std::int64_t> VocabularyTask::encode(const std::string& text) const {
  std::vector<std::int64_t> tokens;
  std::istringstream words(text);
  for (std::string w; words >> w;) {
    const auto named = std::find(names_.begin(), names_.end(), w);
    if (named != names_.end()) {
      tokens.push_back(std::int64_t(named - names_.begin()));
      continue;
    }
    const auto id = parse_count(w);
    if (!id || *id >= info_.vocab_size)
      fail(info_.name, "cannot read '{}' in \"{}\": a token is a name the run saved or an id 0-{}", w, text,
           info_.vocab_size - 1);
    tokens.push_back(std::int64_t(*id));
  }
  return tokens;
}

std::string VocabularyTask::token_name(std::int64_t token) const {
  return token >= 0 && std::size_t(token) < names_.size() ? names_[std::size_t(token)] : std::to_string(token);
}

}  // namespace qkv::tasks
