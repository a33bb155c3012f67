#pragma once
// What the qkv program's subcommands share. Each subcommand is a file of its own: add_NAME adds
// it to the command line, and once it is parsed, sets `run` to what the subcommand does: library
// calls, and their results printed.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "qkv/tasks/task.hpp"
#include "qkv/training/options.hpp"

namespace qkv::cli {

// The subcommand's work, with the exit status it returns.
using Command = std::function<int()>;

void add_gradcheck(CLI::App& app, Command& run);
void add_tasks(CLI::App& app, Command& run);
void add_train(CLI::App& app, Command& run);
void add_eval(CLI::App& app, Command& run);
void add_ablate(CLI::App& app, Command& run);
void add_patch(CLI::App& app, Command& run);
void add_attribute(CLI::App& app, Command& run);
void add_generate(CLI::App& app, Command& run);
void add_inspect(CLI::App& app, Command& run);
void add_experiment(CLI::App& app, Command& run);
void add_sweep(CLI::App& app, Command& run);

// A bad command line: the program exits with code 2, naming the option.
template <class... Args>
[[noreturn]] void usage(std::string_view option, fmt::format_string<Args...> text, Args&&... args) {
  throw training::UsageError(fmt::format("{}: {}", option, fmt::format(text, std::forward<Args>(args)...)));
}

// -j/--jobs of a command that runs many runs: each a process of one thread; by default the cores.
std::uint64_t default_jobs();
void add_jobs_option(CLI::App& sub, std::uint64_t& jobs);

// A whole number in [lo, hi], checked on the text before CLI11 converts it: the conversion would
// wrap "-1" into an unsigned option, and cap a number too large for its type.
CLI::Validator whole(std::uint64_t lo, std::uint64_t hi);

// Whether the terminal at `fd` shows colours and in-place lines: a terminal, other than a dumb one.
bool escapes_shown(int fd);

}  // namespace qkv::cli
