#include "examples/cli/tasks/task.hpp"

#include <fmt/format.h>

#include "examples/cli/registry.hpp"


namespace qkv::cli {

IndexArray filled(std::size_t rows, std::size_t cols, std::int64_t value) {
  IndexArray a = IndexArray::from_shape({rows, cols});
  a.fill(value);
  return a;
}

Metrics score(const IndexArray& predictions, const Batch& batch) {
  if (predictions.shape() != batch.targets.shape())
    fail("score", "predictions of shape {} for targets of shape {}", to_string(to_shape(predictions.shape())),
         to_string(to_shape(batch.targets.shape())));
  const std::size_t B = batch.targets.shape()[0], T = batch.targets.shape()[1];
  std::size_t correct = 0, sequences = 0, exact = 0;
  Metrics m;
  for (std::size_t b = 0; b < B; ++b) {
    std::size_t scored = 0, right = 0;
    for (std::size_t t = 0; t < T; ++t) {
      if (batch.targets(b, t) == ignore_target) continue;
      ++scored;
      right += predictions(b, t) == batch.targets(b, t);
    }
    m.scored += scored;
    correct += right;
    if (scored > 0) {
      ++sequences;
      exact += right == scored;
    }
  }
  m.accuracy = m.scored ? double(correct) / double(m.scored) : 0;
  m.exact_match = sequences ? double(exact) / double(sequences) : 0;
  m.sequences = sequences;
  return m;
}

std::vector<std::string> task_names() { return names_of(task_registry()); }

const TaskSpec& task_spec(const std::string& name) { return find_spec(task_registry(), name, "task"); }

std::unique_ptr<Task> make_task(const std::string& name) { return task_spec(name).make(); }

}  // namespace qkv::cli
