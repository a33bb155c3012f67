// The tasks the program knows, in the order `qkv tasks` lists them. Task NAME is defined in
// tasks/NAME.cpp as `TaskSpec NAME_task()`; a new task is that file and its name on this line:
#define QKV_TASKS(TASK) \
  TASK(brackets) TASK(rps) TASK(induction) TASK(line) TASK(cycle) TASK(reverse) TASK(sort) TASK(translate)

#include "qkv/tasks/task.hpp"

namespace qkv::cli {

#define QKV_DECLARE_TASK(name) TaskSpec name##_task();
QKV_TASKS(QKV_DECLARE_TASK)

const std::vector<TaskSpec>& task_registry() {
#define QKV_TASK_SPEC(name) name##_task(),
  static const std::vector<TaskSpec> tasks = {QKV_TASKS(QKV_TASK_SPEC)};
  return tasks;
}

}  // namespace qkv::cli
