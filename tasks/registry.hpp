#pragma once
// The registry of the tasks qkv knows, one TaskSpec each, listed once in tasks/registry.cpp: how
// to make each, the model and training defaults with which it reaches its target, and what
// reports and experiments measure on it. Nothing else names a task. A program adds its own with
// register_task.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "qkv/tasks/task.hpp"
#include "qkv/tasks/train_options.hpp"

namespace qkv::tasks {

// A column of a results table: a run's value `key`, printed with `format` under `header`.
struct Column {
  std::string key, header, format;
};

// What a task measures beyond accuracy, on a trained (or initial) model: named values, and any
// bound the measurement proves broken (a bug).
struct Probe {
  std::vector<std::pair<std::string, double>> values;
  std::vector<std::string> violations;
};

// Sequences of other lengths than training's: their range as text, and the task that makes them.
struct LongerLengths {
  std::string lengths;
  std::function<std::unique_ptr<Task>()> make;
};

// A change of the input that changes the answer, for activation patching (`qkv ablate`): tokens
// of the clean batch's shape (induction: the first copy drawn afresh, so that the second copy's
// answers are not in it). The clean batch's targets stay the ones scored.
struct Corruption {
  std::string description;  // "the first copy drawn afresh"
  std::function<IndexArray(const Task& task, const Batch& clean, Generator& gen)> make;
};

// Everything the program knows about a task. One per task, in its own file, listed once in
// tasks/registry.cpp; nothing else names a task.
struct TaskSpec {
  std::string name;
  // The task with its default lengths, of size n (`qkv train cycle --n 5`) for a task that has sizes.
  std::function<std::unique_ptr<Task>(std::size_t n)> make;
  std::vector<std::size_t> sizes{};  // the sizes n it takes; empty: none (n is 0), or the range below
  std::size_t default_size = 0;
  std::size_t min_size = 0, max_size = 0;  // with max_size > 0 (and no `sizes`): every n in [min_size, max_size]
  // A data-set task (tasks/task.hpp, DatasetTask): the task of size n with a share `train_fraction`
  // of its examples in the training split, split by `seed`; `make` is its split of seed 0 at the
  // default share.
  std::function<std::unique_ptr<Task>(std::size_t n, double train_fraction, std::uint64_t seed)> make_dataset{};
  double train_fraction = 0;  // a data-set task's default share
  // Model and training settings of `qkv train NAME`, beyond the vocabulary, readout and mask
  // that the task's info sets; with them the task reaches `target` accuracy on held-out sequences.
  std::function<void(TrainOptions&)> defaults = [](TrainOptions&) {};
  double target = 0.99;
  // Longer sequences than training's, which `qkv eval` also scores when the model has the
  // positions for them (`train --max-len`): brackets "26-40" and "42-64".
  std::vector<LongerLengths> longer{};
  // What a pointer target is called in reports: "weight on opener".
  std::string target_name = "target";
  // Extra measurements for `qkv experiment`, and the columns of them its tables show.
  std::function<Probe(const nn::Transformer& model, std::uint64_t seed)> probe{};
  std::vector<Column> probe_columns{};
  // For `qkv ablate`'s activation patching; none: the task has no corrupted input.
  std::optional<Corruption> corruption{};
};

// The TaskSpec of a seq2seq task: an encoder of `encoder_layers` and a decoder of one layer, 2 heads,
// d_model 64, trained `steps` steps; each reaches 99% exact match on held-out sources.
TaskSpec seq2seq_spec(std::string name, std::function<std::unique_ptr<Task>()> make, std::size_t encoder_layers,
                      std::size_t steps);

// Every task: the built-in ones in the order `qkv tasks` lists them, then those registered.
std::vector<TaskSpec> task_registry();
// Makes a task of the program's own known by name for the rest of the process, as the built-in
// ones are: train, read_config, evaluate and inspect then take it (a run's config.json names it,
// so reading the run again needs it registered again). A name registered again is the latest
// spec from then on. std::invalid_argument for a built-in task's name, a name that is not 1 to 64
// letters, digits, '_' or '-', or a spec without `make`. Safe to call from any thread.
void register_task(TaskSpec spec);
std::vector<std::string> task_names();
// Throws std::invalid_argument naming the task and listing the known ones.
const TaskSpec& task_spec(const std::string& name);
// The task of size n (0: its default size, or none); std::invalid_argument naming the task and the
// sizes it takes for any other n.
std::unique_ptr<Task> make_task(const std::string& name, std::size_t n = 0);
// The task of a run's options: of size o.n and, for a data-set task, split by o.train_fraction and
// o.seed. The same errors, and a data-set task's for a share that leaves a split empty.
std::unique_ptr<Task> make_task(const TrainOptions& o);
// n itself, or the task's default size for 0; the same errors.
std::size_t task_size(const std::string& name, std::size_t n);
// The sizes a task takes, as text: "3, 5, 7", "2-1000"; "" for none.
std::string sizes_text(const TaskSpec& spec);

// The defaults of each task (its TaskSpec's), with which `qkv train TASK` reaches its target.
TrainOptions default_options(const std::string& task, std::size_t n = 0);

}  // namespace qkv::tasks
