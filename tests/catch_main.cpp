// The tests run on the BLAS kernels and threads the programs use.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "qkv/core/runtime.hpp"

int main(int argc, char** argv) {
  qkv::use_fastest_blas_kernels();
  qkv::set_num_threads(1);
  return Catch::Session().run(argc, argv);
}
