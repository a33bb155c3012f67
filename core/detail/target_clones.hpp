#pragma once
// QKV_CLONES compiles a function once for AVX-512, once for AVX2 and once for the baseline, and
// picks one when the program loads. Files that use it are built with -ffp-contract=off (they are
// CMakeLists.txt's QKV_CLONED_SOURCES, which configuring checks), so that every version computes
// the same bits.
#if defined(__SANITIZE_THREAD__)
#define QKV_CLONES  // the loader runs target_clones' resolvers before ThreadSanitizer's runtime is up
#else
#define QKV_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
