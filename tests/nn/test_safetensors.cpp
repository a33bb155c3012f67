#include "tests/helpers.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "qkv/nn/safetensors.hpp"

using namespace qkv;
using namespace qkv::nn;
using namespace qkv::test;
using Catch::Matchers::Contains;
using Catch::Matchers::Equals;

namespace {

// header length (u64 little-endian) + header + data.
std::string file_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const std::uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

std::string floats(std::initializer_list<float> values) {
  std::string out(values.size() * 4, '\0');
  std::memcpy(out.data(), values.begin(), out.size());
  return out;
}

// What the loader says of `bytes` as a file model.safetensors ("" when it loads).
std::string load_error(const std::string& bytes) {
  return runtime_error_message([&] { parse_safetensors(bytes, "model.safetensors"); });
}

}  // namespace

TEST_CASE("safetensors round trip: names, order, dtypes, shapes, values and metadata") {
  const std::string path = scratch("roundtrip") + "/model.safetensors";
  const StateDict tensors = {{"layers.0.w", f32({{1.5f, -2}, {3, 4}})}, {"b", f64({1e-300, -0.0, 7})},
                             {"s", scalar(2.25, DType::float64)}, {"empty", zeros({0, 3})}};
  save_safetensors(path, tensors, {{"task", "rps"}});
  const Safetensors loaded = load_safetensors(path);
  REQUIRE(loaded.tensors.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) {
    INFO(tensors[i].first);
    CHECK(loaded.tensors[i].first == tensors[i].first);
    CHECK(loaded.tensors[i].second.dtype() == tensors[i].second.dtype());
    CHECK(loaded.tensors[i].second.shape() == tensors[i].second.shape());
  }
  CHECK(loaded.tensors[0].second.value<float>() == tensors[0].second.value<float>());
  CHECK(loaded.tensors[1].second.value<double>() == tensors[1].second.value<double>());
  CHECK(loaded.metadata.at("task") == "rps");
}

TEST_CASE("the file follows the safetensors layout byte for byte") {
  const std::string path = scratch("layout") + "/x.safetensors";
  save_safetensors(path, {{"w", f32({1.0f, 2.0f})}});
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  CHECK(n % 8 == 0);  // padded, so the data starts 8-byte aligned
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  CHECK(header["w"]["dtype"] == "F32");
  CHECK(header["w"]["shape"] == nlohmann::json::array({2}));
  CHECK(header["w"]["data_offsets"] == nlohmann::json::array({0, 8}));
  CHECK(bytes.substr(8 + n) == floats({1.0f, 2.0f}));
}

TEST_CASE("a file from an independent writer loads with its values") {
  const Safetensors f = load_safetensors(QKV_FIXTURES "/reference.safetensors");
  REQUIRE(f.tensors.size() == 3);
  CHECK(f.tensors[0].first == "c");
  CHECK(f.tensors[0].second.item() == 7.5);
  CHECK(f.tensors[1].first == "a");
  check_close(f.tensors[1].second, {{0, 0.25, 0.5}, {0.75, 1, 1.25}}, 0);
  CHECK(f.tensors[2].second.dtype() == DType::float64);
  check_close(f.tensors[2].second, {1e-300, -2.5, 3.25, 1e300}, 0);
  CHECK(f.metadata.at("task") == "brackets");
}

TEST_CASE("the loader rejects each kind of broken file, naming the file and the fault") {
  const std::string ok_header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  CHECK(load_error(file_bytes(ok_header, floats({1, 2}))).empty());
  CHECK(load_error("") == "model.safetensors: empty or truncated: 0 bytes, but the header length alone takes 8");
  CHECK_THAT(load_error("abc"), Contains("empty or truncated: 3 bytes"));
  CHECK_THAT(load_error(file_bytes(ok_header, floats({1, 2})).substr(0, 20)),
             Contains(fmt::format("header length {} is larger than the 12 bytes that follow it", ok_header.size())));
  std::string huge(16, '\xff');
  CHECK_THAT(load_error(huge), Contains("header length 18446744073709551615 is larger"));
  CHECK_THAT(load_error(file_bytes(R"({"w": {"dtype": )", "")), Contains("model.safetensors (its header): invalid JSON"));
  CHECK_THAT(load_error(file_bytes("[1, 2]", "")), Contains("the JSON header is not an object"));
  CHECK_THAT(load_error(file_bytes(R"({"w":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", floats({1, 2}))),
             Contains("tensor 'w': unknown dtype 'Q7'"));
  CHECK_THAT(load_error(file_bytes(R"({"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", floats({1, 2}))),
             Contains("tensor 'w': dtype I64 is not supported"));
  CHECK_THAT(load_error(file_bytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", floats({1, 2}))),
             Contains("tensor 'w': shape (3) of F32 needs 12 bytes, but data_offsets span 8"));
  CHECK_THAT(load_error(file_bytes(
                 R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", floats({1, 2}))),
             Contains("needs more than 2^64 bytes, but data_offsets span 8"));
  CHECK_THAT(load_error(file_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", floats({1, 2}))),
             Contains("data_offsets [4, 12] lie outside the 8 bytes of data"));
  CHECK_THAT(load_error(file_bytes(
                 R"({"v":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                 floats({1, 2}))),
             Contains("overlaps tensor 'v'"));
  CHECK_THAT(load_error(file_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", floats({1, 2}))),
             Contains("bytes 0 to 4 of the data belong to no tensor"));
  CHECK_THAT(load_error(file_bytes(ok_header, floats({1, NAN}))), Contains("tensor 'w' holds nan at flat index 1"));
  CHECK_THAT(load_error(file_bytes(ok_header, floats({INFINITY, 2}))), Contains("tensor 'w' holds inf at flat index 0"));
  CHECK_THAT(load_error(file_bytes(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", floats({1, 2}))),
             Contains("tensor 'w': shape entry 0 is a number, not a size"));
  CHECK_THAT(load_error(file_bytes(R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", floats({1, 2}))),
             Contains("tensor 'w': shape entry 0 is a number, not a size"));
  CHECK_THAT(load_error(file_bytes(R"({"w":{"dtype":"F32","shape":[1,[2]],"data_offsets":[0,8]}})", floats({1, 2}))),
             Contains("JSON nested more than 3 levels deep"));
  // Nested 100,000 deep: printing, copying or freeing such a value recursively would overflow the stack.
  const std::string deep = R"({"w":{"dtype":"F32","shape":)" + std::string(100000, '[') + std::string(100000, ']') +
                           R"(,"data_offsets":[0,8]}})";
  CHECK_THAT(load_error(file_bytes(deep, floats({1, 2}))),
             Equals("model.safetensors (its header): JSON nested more than 3 levels deep"));
  CHECK_THAT(load_error(file_bytes(R"({"__metadata__":{"k":3}})", "")), Contains("__metadata__ 'k' is not a string"));
  CHECK_THROWS_WITH(load_safetensors("/nonexistent/x.safetensors"), Contains("/nonexistent/x.safetensors: cannot open"));
}

TEST_CASE("a save that died midway leaves the checkpoint there intact") {
  const std::string path = scratch("atomic") + "/model.safetensors";
  save_safetensors(path, {{"w", f32({1.0f, 2.0f})}});
  {
    std::ofstream stale(path + ".tmp", std::ios::binary);  // what a save killed mid-write leaves
    stale << "\x10\x00\x00 half a header";
  }
  CHECK(load_safetensors(path).tensors[0].second.value<float>() == Array<float>{1.0f, 2.0f});
  save_safetensors(path, {{"w", f32({3.0f, 4.0f})}});
  CHECK(load_safetensors(path).tensors[0].second.value<float>() == Array<float>{3.0f, 4.0f});
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
}
