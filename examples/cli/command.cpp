#include "examples/cli/command.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <thread>
#include <stdexcept>

#include "qkv/core/shape.hpp"

namespace qkv::cli {

CLI::Validator whole(std::uint64_t lo, std::uint64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        const auto value = parse_count(text);
        if (!value || *value < lo || *value > hi)
          return fmt::format("must be a whole number from {} to {}, got '{}'", lo, hi, text);
        return "";
      },
      fmt::format("INT in [{}, {}]", lo, hi));
}

std::uint64_t default_jobs() { return std::max(1u, std::thread::hardware_concurrency()); }

void add_jobs_option(CLI::App& sub, std::uint64_t& jobs) {
  sub.add_option("-j,--jobs", jobs, "Runs at once, each a process of one thread (default: the cores)")->check(whole(1, 1024));
}

bool escapes_shown(int fd) {
  const char* term = std::getenv("TERM");
  return ::isatty(fd) && !(term && std::string_view(term) == "dumb");
}

}  // namespace qkv::cli
