// qkv gradcheck [--filter TEXT]: every op's gradient against finite differences, in float64.
#include <memory>

#include "examples/cli/command.hpp"
#include "qkv/nn/gradcheck_cases.hpp"

namespace qkv::cli {

namespace {

// One row per configuration; exit status 1 when any fails, 2 when none matches the filter.
int run_gradcheck(const std::string& filter) {
  std::size_t passed = 0, failed = 0;
  fmt::print("{:<52} {:>12} {:>12}  {}\n", "check", "max abs err", "max rel err", "result");
  for (const auto& c : nn::gradcheck_cases()) {
    if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
    const GradcheckResult r = c.run();
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

void add_gradcheck(CLI::App& app, Command& run) {
  auto filter = std::make_shared<std::string>();
  auto* sub = app.add_subcommand("gradcheck", "Check every op's gradient against finite differences (float64)");
  sub->add_option("--filter", *filter, "Only the checks whose name contains this text");
  sub->callback([&run, filter] { run = [filter] { return run_gradcheck(*filter); }; });
}

}  // namespace qkv::cli
