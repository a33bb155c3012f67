// The tasks the program knows, in the order `qkv tasks` lists them. Task NAME is defined in
// tasks/NAME.cpp as `TaskSpec NAME_task()`; a new task is that file and its name on this line:
#define QKV_TASKS(TASK) \
  TASK(brackets) TASK(rps) TASK(induction) TASK(line) TASK(cycle) TASK(reverse) TASK(sort) TASK(translate)

#include "qkv/tasks/registry.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "qkv/tasks/find_spec.hpp"

namespace qkv::tasks {

#define QKV_DECLARE_TASK(name) TaskSpec name##_task();
QKV_TASKS(QKV_DECLARE_TASK)

const std::vector<TaskSpec>& task_registry() {
#define QKV_TASK_SPEC(name) name##_task(),
  static const std::vector<TaskSpec> tasks = {QKV_TASKS(QKV_TASK_SPEC)};
  return tasks;
}


TaskSpec seq2seq_spec(std::string name, std::function<std::unique_ptr<Task>()> make, std::size_t encoder_layers,
                      std::size_t steps) {
  return {.name = std::move(name),
          .make = [make = std::move(make)](std::size_t) { return make(); },
          .defaults =
              [=](TrainOptions& o) {
                o.encoder_layers = encoder_layers;
                o.model.layers = 1;
                o.model.heads = 2;
                o.model.d_model = 64;
                o.steps = steps;
              },
          .target = 0.99};
}

std::vector<std::string> task_names() { return names_of(task_registry()); }

const TaskSpec& task_spec(const std::string& name) { return find_spec(task_registry(), name, "task"); }

std::size_t task_size(const std::string& name, std::size_t n) {
  const TaskSpec& spec = task_spec(name);
  if (n == 0) return spec.default_size;
  if (spec.sizes.empty()) fail(name, "the {} task takes no size (n), got {}", name, n);
  if (std::find(spec.sizes.begin(), spec.sizes.end(), n) == spec.sizes.end())
    fail(name, "n must be one of {}, not {}", fmt::join(spec.sizes, ", "), n);
  return n;
}

std::unique_ptr<Task> make_task(const std::string& name, std::size_t n) {
  return task_spec(name).make(task_size(name, n));
}

TrainOptions default_options(const std::string& task_name, std::size_t n) {
  const TaskSpec& spec = task_spec(task_name);
  TrainOptions o;
  o.task = task_name;
  o.n = task_size(task_name, n);
  const TaskInfo info = spec.make(o.n)->info();
  o.model.vocab_size = info.vocab_size;
  o.model.n_classes = info.n_classes;
  o.model.max_len = info.max_len;
  o.model.readout = info.readout;
  o.model.causal = info.causal;
  if (info.seq2seq) {
    o.encoder_layers = 1;
    o.max_source_len = info.seq2seq->max_source_len;
  }
  spec.defaults(o);
  return o;
}

}  // namespace qkv::tasks
