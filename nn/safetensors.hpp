#pragma once
// Checkpoints as safetensors files: an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets}, "__metadata__": {string: string}}, then the raw
// little-endian data. Python's safetensors and numpy read them as they are.
#include <map>
#include <string>
#include <string_view>

#include "qkv/core/tensor.hpp"
#include "qkv/nn/files.hpp"  // write_atomically

namespace qkv::nn {

struct Safetensors {
  StateDict tensors;                            // in file order
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

// Writes float32 tensors as F32 and float64 as F64, atomically (see write_atomically).
void save_safetensors(const std::string& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata = {});
// The bytes save_safetensors writes; `name` stands for the file in messages.
std::string serialize_safetensors(const StateDict& tensors, const std::map<std::string, std::string>& metadata = {},
                                  const std::string& name = "(in memory)");

// Reads a file that save_safetensors (or Python's safetensors) wrote with F32/F64 tensors.
// Anything else throws std::runtime_error naming the file and the fault: an empty or truncated
// file, a header length past the end, invalid JSON, an unknown or unsupported dtype, a shape
// whose size differs from its byte range, offsets outside the data or overlapping it or
// leaving holes, and non-finite values. It never reads past the file or allocates more than it.
Safetensors load_safetensors(const std::string& path);
// The same for bytes already in memory; `name` stands for the file in messages.
Safetensors parse_safetensors(std::string_view bytes, const std::string& name);

}  // namespace qkv::nn
