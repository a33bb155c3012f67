// The qkv program: train toy attention models and look inside them. Each subcommand is a file of
// its own in this folder (command.hpp); this one parses the command line and reports errors.
#include <exception>

#include "examples/cli/command.hpp"
#include "qkv/core/runtime.hpp"
#include "qkv/training/trainer.hpp"
#include "qkv/version.hpp"

int main(int argc, char** argv) {
  using namespace qkv::cli;
  qkv::use_fastest_blas_kernels();
  qkv::set_num_threads(1);  // and OpenBLAS single-threaded: `train --threads` sets more
  qkv::reuse_freed_memory();
  CLI::App app{"qkv: train small attention models and look inside them"};
  app.set_version_flag("--version", "qkv " QKV_VERSION);
  app.require_subcommand(1);
  Command run;
  for (const auto add : {add_gradcheck, add_tasks, add_train, add_eval, add_ablate, add_patch, add_attribute, add_generate, add_inspect, add_experiment,
                         add_sweep})
    add(app, run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    return run();
  } catch (const qkv::training::UsageError& e) {
    fmt::print(stderr, "qkv: {}\n", e.what());
    return 2;
  } catch (const qkv::training::Interrupted& e) {
    fmt::print(stderr, "qkv: {}\n", e.what());
    return 128 + e.signal;
  } catch (const std::exception& e) {
    fmt::print(stderr, "qkv: error: {}\n", e.what());
    return 1;
  }
}
