// qkv tasks: the registered tasks, one a line.
#include "examples/cli/command.hpp"
#include "qkv/tasks/registry.hpp"

namespace qkv::cli {

void add_tasks(CLI::App& app, Command& run) {
  auto* sub = app.add_subcommand("tasks", "List the tasks");
  sub->callback([&run] {
    run = [] {
      for (const std::string& name : tasks::task_names())
        fmt::print("{:<10} {}\n", name, tasks::make_task(name)->info().description);
      return 0;
    };
  });
}

}  // namespace qkv::cli
