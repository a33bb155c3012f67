#pragma once
// The experiments' sweep files as text: experiment_files.cpp, which CMake makes from
// experiments/NAME.json.
#include <cstddef>

namespace qkv::experiments::detail {

struct ShippedFile {
  const char* name;
  const char* text;
};

extern const ShippedFile shipped_files[];
extern const std::size_t shipped_file_count;

}  // namespace qkv::experiments::detail
