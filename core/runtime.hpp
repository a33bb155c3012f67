#pragma once
// Process-wide settings: threads, BLAS kernels, memory.
//
// Threads, as torch.set_num_threads: qkv splits its own work (attention per batch entry and head,
// small layers in slabs of rows, row blocks of large matrix products, large ReLUs, bias adds, bias
// gradients, embedding lookups and their gradients) across a pool of this many threads, and
// set_num_threads makes OpenBLAS single-threaded inside them, so the two never compete for cores.
// The default is 1; until set_num_threads is called, OpenBLAS keeps its own setting
// (OPENBLAS_NUM_THREADS, or one thread per core).
// With a given number of threads, results are bit-identical from run to run: each output element
// is computed by one thread, in a fixed order. Between different numbers of threads they may
// differ in the last bits, since a product split into blocks can take other BLAS kernels.
#include <cstddef>
#include <string>

namespace qkv {

void set_num_threads(std::size_t n);  // n ≥ 1; waits for a running job; not from inside one
std::size_t get_num_threads();

// Keeps freed memory in the process for reuse, instead of handing blocks of up to 32 MiB back to
// the system at once (glibc's mallopt). A training step frees and allocates the same large arrays every
// step; without this, each allocation maps fresh pages and pays a page fault per 4 KiB. The
// process then holds on to its peak memory. The qkv program and qkv-bench call it first thing.
void reuse_freed_memory();

// The BLAS kernels in use, e.g. "SkylakeX" (OpenBLAS's name for them). They decide the last bits
// of every product, so a run records them: a resumed run is bit-identical only on the same ones.
std::string blas_kernels();

// Where OpenBLAS fell back to its slowest kernels on a CPU it does not know (OpenBLAS 0.3.21 on
// Sapphire Rapids, say), and OPENBLAS_CORETYPE does not choose, switches to the newest kernels the
// CPU runs; returns the kernels in use. Linking qkv changes nothing by itself: programs call this
// first thing in main, before any other thread starts (it sets and unsets OPENBLAS_CORETYPE).
std::string use_fastest_blas_kernels();

}  // namespace qkv
