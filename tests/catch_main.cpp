// The tests run on the BLAS kernels the programs use.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "core/runtime.hpp"

int main(int argc, char** argv) {
  qkv::use_fastest_blas_kernels();
  return Catch::Session().run(argc, argv);
}
