#pragma once
// The task of a run folder whose config.json names no task qkv knows (a library program's run,
// written with nn::save_config and nn::save_checkpoint): known only by its model's vocabulary. Its
// tokens are ids, named as the run saved them (config.json's "tokens") or by their numbers; it
// draws no sequences, so what is inspected is given as token names or ids.
#include <string>
#include <vector>

#include "qkv/nn/transformer.hpp"
#include "qkv/tasks/task.hpp"

namespace qkv::tasks {

class VocabularyTask : public Task {
 public:
  // `names`: one per token id, or none (tokens are named by their ids). Throws
  // std::invalid_argument when there are names but not one per token.
  VocabularyTask(std::string name, const nn::TransformerConfig& model, std::vector<std::string> names = {});
  const TaskInfo& info() const override { return info_; }
  // Throws std::invalid_argument: the task has no sequences of its own.
  Batch sample(std::size_t batch_size, Generator& gen) const override;
  // Token names, space-separated.
  std::string decode(const std::vector<std::int64_t>& tokens) const override;
  // Each space-separated word a token's name or its id.
  std::vector<std::int64_t> encode(const std::string& text) const override;
  std::string token_name(std::int64_t token) const override;

 private:
  TaskInfo info_;
  std::vector<std::string> names_;
};

}  // namespace qkv::tasks
