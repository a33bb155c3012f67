#include "qkv/nn/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "qkv/nn/detail/json.hpp"

namespace qkv::nn {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

template <class... Args>
[[noreturn]] void bad_file(const std::string& file, fmt::format_string<Args...> text, Args&&... args) {
  throw std::runtime_error(fmt::format("{}: {}", file, fmt::format(text, std::forward<Args>(args)...)));
}

std::string_view dtype_code(DType dtype) { return dtype == DType::float32 ? "F32" : "F64"; }

// Reads the little-endian u64 at the start of `bytes`.
std::uint64_t read_u64(std::string_view bytes) {
  std::uint64_t v;
  std::memcpy(&v, bytes.data(), 8);
  return v;
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  std::uint64_t begin, end;
};

Entry parse_entry(const std::string& file, const std::string& name, const nlohmann::json& info) {
  if (!info.is_object()) bad_file(file, "tensor '{}': its header entry is not an object", name);
  Entry e{name, DType::float32, {}, 0, 0};
  const auto dtype = info.find("dtype");
  if (dtype == info.end() || !dtype->is_string()) bad_file(file, "tensor '{}': no dtype string", name);
  const std::string code = *dtype;
  static const std::vector<std::string> known = {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16",
                                                  "BF16", "I32", "U32", "F32", "F64", "I64", "U64"};
  if (code == "F32") e.dtype = DType::float32;
  else if (code == "F64") e.dtype = DType::float64;
  else if (std::find(known.begin(), known.end(), code) != known.end())
    bad_file(file, "tensor '{}': dtype {} is not supported (qkv reads F32 and F64)", name, code);
  else
    bad_file(file, "tensor '{}': unknown dtype '{}'", name, code);
  const auto shape = info.find("shape");
  if (shape == info.end() || !shape->is_array()) bad_file(file, "tensor '{}': no shape array", name);
  for (std::size_t i = 0; i < shape->size(); ++i) {
    const nlohmann::json& d = (*shape)[i];
    if (!d.is_number_unsigned())
      bad_file(file, "tensor '{}': shape entry {} is a {}, not a size", name, i, d.type_name());
    e.shape.push_back(d.get<std::size_t>());
  }
  const auto offsets = info.find("data_offsets");
  if (offsets == info.end() || !offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned())
    bad_file(file, "tensor '{}': data_offsets must be two byte positions", name);
  e.begin = (*offsets)[0];
  e.end = (*offsets)[1];
  return e;
}

template <class T>
Tensor read_tensor(const std::string& file, const Entry& e, const char* data) {
  Array<T> a = Array<T>::from_shape(e.shape);
  if (e.end > e.begin) std::memcpy(a.data(), data + e.begin, e.end - e.begin);  // an empty array may have no buffer
  const auto bad = std::find_if(a.begin(), a.end(), [](T v) { return !std::isfinite(v); });
  if (bad != a.end())
    bad_file(file, "tensor '{}' holds {} at flat index {}", e.name, *bad, std::size_t(bad - a.begin()));
  return Tensor(std::move(a));
}

}  // namespace

Safetensors parse_safetensors(std::string_view bytes, const std::string& file) {
  if (bytes.size() < 8)
    bad_file(file, "empty or truncated: {} bytes, but the header length alone takes 8", bytes.size());
  const std::uint64_t header_size = read_u64(bytes);
  if (header_size > bytes.size() - 8)
    bad_file(file, "header length {} is larger than the {} bytes that follow it", header_size, bytes.size() - 8);
  // The header nests three levels: {name: {"shape": [sizes]}}.
  const nlohmann::json header = detail::parse_json(bytes.substr(8, header_size), file + " (its header)", 3);
  if (!header.is_object()) bad_file(file, "the JSON header is not an object");
  const std::string_view data = bytes.substr(8 + header_size);

  Safetensors out;
  std::vector<Entry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) bad_file(file, "__metadata__ is not an object");
      for (const auto& [key, value] : info.items()) {
        if (!value.is_string()) bad_file(file, "__metadata__ '{}' is not a string", key);
        out.metadata[key] = value;
      }
      continue;
    }
    entries.push_back(parse_entry(file, name, info));
  }
  for (const Entry& e : entries) {
    if (e.begin > e.end || e.end > data.size())
      bad_file(file, "tensor '{}': data_offsets [{}, {}] lie outside the {} bytes of data", e.name, e.begin, e.end,
               data.size());
    // shape × dtype size, without overflow: it must equal the byte range exactly.
    const std::uint64_t span = e.end - e.begin;
    std::uint64_t need = dtype_size(e.dtype);
    bool exceeds = false;
    if (std::find(e.shape.begin(), e.shape.end(), 0) != e.shape.end()) {
      need = 0;
    } else {
      for (std::size_t d : e.shape) {
        if (need > std::numeric_limits<std::uint64_t>::max() / d) {
          exceeds = true;
          break;
        }
        need *= d;
      }
    }
    if (exceeds || need != span)
      bad_file(file, "tensor '{}': shape {} of {} needs {} bytes, but data_offsets span {}", e.name, to_string(e.shape),
               dtype_code(e.dtype), exceeds ? std::string("more than 2^64") : fmt::format("{}", need), span);
  }
  // The byte ranges must tile the data: no overlap, no hole.
  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::uint64_t covered = 0;
  for (std::size_t i = 0; i < by_offset.size(); ++i) {
    const Entry& e = *by_offset[i];
    if (e.begin < covered)
      bad_file(file, "tensor '{}' at [{}, {}] overlaps tensor '{}' which ends at {}", e.name, e.begin, e.end,
               by_offset[i - 1]->name, covered);
    if (e.begin > covered) bad_file(file, "bytes {} to {} of the data belong to no tensor", covered, e.begin);
    covered = e.end;
  }
  if (covered != data.size()) bad_file(file, "bytes {} to {} of the data belong to no tensor", covered, data.size());

  // Tensors in file order (of offsets), as written.
  for (const Entry* e : by_offset)
    out.tensors.emplace_back(e->name, e->dtype == DType::float32 ? read_tensor<float>(file, *e, data.data())
                                                                  : read_tensor<double>(file, *e, data.data()));
  return out;
}

Safetensors load_safetensors(const std::string& path) {
  // The data is copied once more into the tensors: a file larger than half the memory available
  // could not be loaded.
  return parse_safetensors(read_file(path, std::size_t(available_memory() / 2)), path);
}

void save_safetensors(const std::string& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata) {
  write_atomically(path, serialize_safetensors(tensors, metadata, path));
}

std::string serialize_safetensors(const StateDict& tensors, const std::map<std::string, std::string>& metadata,
                                  const std::string& path) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__" || header.contains(name))
      throw std::invalid_argument(fmt::format("save_safetensors: {}: tensor name '{}' is reserved or repeated", path, name));
    if (!t.defined()) throw std::invalid_argument(fmt::format("save_safetensors: {}: tensor '{}' is undefined", path, name));
    const std::uint64_t n = t.numel() * dtype_size(t.dtype());
    header[name] = {{"dtype", dtype_code(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // pads the data to an 8-byte boundary, as Python's writer does
  std::string bytes(8, '\0');
  const std::uint64_t header_size = json.size();
  std::memcpy(bytes.data(), &header_size, 8);
  bytes += json;
  bytes.reserve(bytes.size() + offset);
  for (const auto& [name, t] : tensors) {
    const char* p = t.dtype() == DType::float32 ? reinterpret_cast<const char*>(t.value<float>().data())
                                                : reinterpret_cast<const char*>(t.value<double>().data());
    bytes.append(p, t.numel() * dtype_size(t.dtype()));
  }
  return bytes;
}

}  // namespace qkv::nn
