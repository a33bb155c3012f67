// The qkv program: train toy attention models and look inside them.
#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "examples/gradcheck_cases.hpp"

namespace {

// One row per configuration; exit status 1 when any fails.
int run_gradcheck(const std::string& filter) {
  using qkv::examples::gradcheck_cases;
  std::size_t passed = 0, failed = 0;
  fmt::print("{:<52} {:>12} {:>12}  {}\n", "check", "max abs err", "max rel err", "result");
  for (const auto& c : gradcheck_cases()) {
    if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
    const qkv::GradcheckResult r = c.run();
    fmt::print("{:<52} {:>12.3e} {:>12.3e}  {}\n", c.name, r.max_abs_error, r.max_rel_error, r.passed ? "PASS" : "FAIL");
    if (!r.passed) fmt::print("    {}\n", r.failure);
    (r.passed ? passed : failed)++;
  }
  if (passed + failed == 0) {
    fmt::print(stderr, "qkv gradcheck: no check matches --filter '{}'\n", filter);
    return 2;
  }
  fmt::print("gradcheck: {} passed, {} failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"qkv: train small attention models and look inside them"};
  app.require_subcommand(1);

  std::string filter;
  auto* gradcheck = app.add_subcommand("gradcheck", "Check every op's gradient against finite differences (float64)");
  gradcheck->add_option("--filter", filter, "Only the checks whose name contains this text");

  CLI11_PARSE(app, argc, argv);
  try {
    if (*gradcheck) return run_gradcheck(filter);
  } catch (const std::exception& e) {
    fmt::print(stderr, "qkv: error: {}\n", e.what());
    return 2;
  }
  return 0;
}
