// The tasks the program knows, in the order `qkv tasks` lists them. Task NAME is defined in
// tasks/NAME.cpp as `TaskSpec NAME_task()`; a new task is that file and its name on this line:
#define QKV_TASKS(TASK) \
  TASK(brackets) TASK(rps) TASK(induction) TASK(line) TASK(cycle) TASK(reverse) TASK(sort) TASK(translate) TASK(modadd)

#include "qkv/tasks/registry.hpp"

#include <algorithm>
#include <cctype>
#include <deque>
#include <mutex>

#include <fmt/format.h>
#include <fmt/ranges.h>


namespace qkv::tasks {

#define QKV_DECLARE_TASK(name) TaskSpec name##_task();
QKV_TASKS(QKV_DECLARE_TASK)

namespace {

// The built-in tasks, then those a program registered (register_task), a later registration of a
// name after its earlier ones. A deque: a spec found stays where it is while others are added.
struct Registry {
  Registry() {
#define QKV_TASK_SPEC(name) specs.push_back(name##_task());
    QKV_TASKS(QKV_TASK_SPEC)
    builtin = specs.size();
  }
  std::mutex mutex;
  std::deque<TaskSpec> specs;
  std::size_t builtin = 0;
};

Registry& registry() {
  static Registry r;
  return r;
}

// The spec of `name` (its latest registration), or nullptr; under the registry's lock.
const TaskSpec* latest(const Registry& r, const std::string& name) {
  for (auto it = r.specs.rbegin(); it != r.specs.rend(); ++it)
    if (it->name == name) return &*it;
  return nullptr;
}

}  // namespace

std::vector<TaskSpec> task_registry() {
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  std::vector<TaskSpec> specs;
  for (const TaskSpec& spec : r.specs)
    if (latest(r, spec.name) == &spec) specs.push_back(spec);
  return specs;
}

void register_task(TaskSpec spec) {
  const auto is_name_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; };
  if (spec.name.empty() || spec.name.size() > 64 || !std::all_of(spec.name.begin(), spec.name.end(), is_name_char))
    fail("register_task", "a task's name is 1 to 64 letters, digits, '_' or '-', not '{}'", spec.name);
  if (!spec.make) fail("register_task", "the {} task has no `make`", spec.name);
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  for (std::size_t i = 0; i < r.builtin; ++i)
    if (r.specs[i].name == spec.name) fail("register_task", "'{}' is a built-in task's name; give the task another", spec.name);
  r.specs.push_back(std::move(spec));
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

std::vector<std::string> task_names() {
  std::vector<std::string> names;
  for (const TaskSpec& spec : task_registry()) names.push_back(spec.name);
  return names;
}

const TaskSpec& task_spec(const std::string& name) {
  {
    Registry& r = registry();
    const std::lock_guard lock(r.mutex);
    if (const TaskSpec* spec = latest(r, name)) return *spec;
  }
  fail("task", "unknown task '{}' (known: {})", name, fmt::join(task_names(), ", "));
}

std::size_t task_size(const std::string& name, std::size_t n) {
  const TaskSpec& spec = task_spec(name);
  if (n == 0) return spec.default_size;
  if (spec.max_size > 0 && spec.sizes.empty()) {
    if (n < spec.min_size || n > spec.max_size) fail(name, "n must be from {} to {}, not {}", spec.min_size, spec.max_size, n);
    return n;
  }
  if (spec.sizes.empty()) fail(name, "the {} task takes no size (n), got {}", name, n);
  if (std::find(spec.sizes.begin(), spec.sizes.end(), n) == spec.sizes.end())
    fail(name, "n must be one of {}, not {}", sizes_text(spec), n);
  return n;
}

std::string sizes_text(const TaskSpec& spec) {
  if (spec.max_size > 0 && spec.sizes.empty()) return fmt::format("{}-{}", spec.min_size, spec.max_size);
  return fmt::format("{}", fmt::join(spec.sizes, ", "));
}

std::unique_ptr<Task> make_task(const std::string& name, std::size_t n) {
  return task_spec(name).make(task_size(name, n));
}

std::unique_ptr<Task> make_task(const TrainOptions& o) {
  const TaskSpec& spec = task_spec(o.task);
  if (!spec.make_dataset) return spec.make(task_size(o.task, o.n));
  return spec.make_dataset(task_size(o.task, o.n), o.train_fraction, o.seed);
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
  o.train_fraction = spec.train_fraction;
  spec.defaults(o);
  return o;
}

}  // namespace qkv::tasks
