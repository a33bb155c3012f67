// Memory: how freed blocks go back to the system.
#include "qkv/core/runtime.hpp"

#include <malloc.h>

namespace qkv {

void reuse_freed_memory() {
  // Blocks up to 32 MiB (glibc's largest threshold) come from the heap, whose top is never trimmed.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, -1);
}

}  // namespace qkv
