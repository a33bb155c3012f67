#include "tests/helpers.hpp"

#include <sys/stat.h>

#include <fstream>

#include "qkv/nn/detail/json.hpp"
#include "qkv/nn/files.hpp"

using namespace qkv;
using namespace qkv::nn;
using namespace qkv::test;
using Catch::Matchers::Contains;
using Catch::Matchers::Equals;

TEST_CASE("read_file reads regular files whole and refuses FIFOs, folders and files over the limit") {
  const std::string dir = scratch("read_file");
  {
    std::ofstream(dir + "/a.txt", std::ios::binary) << "hello";
  }
  CHECK(read_file(dir + "/a.txt", 5) == "hello");
  CHECK_THAT(runtime_error_message([&] { read_file(dir + "/a.txt", 4); }),
             Equals(dir + "/a.txt: is 5 bytes, more than the 4 such a file may hold"));
  // A FIFO with no writer: opening it for reading would wait forever.
  REQUIRE(::mkfifo((dir + "/fifo").c_str(), 0644) == 0);
  CHECK_THAT(runtime_error_message([&] { read_file(dir + "/fifo", 100); }),
             Equals(dir + "/fifo: is a FIFO, not a regular file"));
  CHECK_THAT(runtime_error_message([&] { read_file(dir, 100); }), Equals(dir + ": is a folder, not a regular file"));
  CHECK_THAT(runtime_error_message([&] { read_file("/dev/zero", 100); }), Contains("is a device, not a regular file"));
  CHECK_THAT(runtime_error_message([&] { read_file(dir + "/missing", 100); }),
             Equals(dir + "/missing: cannot open: No such file or directory"));
}

TEST_CASE("parse_json bounds the nesting before building anything deep") {
  CHECK(nn::detail::parse_json(R"({"a": [1, {"b": 2}]})", "f.json", 3)["a"][1]["b"] == 2);
  CHECK_THAT(runtime_error_message([] { nn::detail::parse_json(R"({"a": [1, {"b": [2]}]})", "f.json", 3); }),
             Equals("f.json: JSON nested more than 3 levels deep"));
  CHECK_THAT(runtime_error_message([] { nn::detail::parse_json(std::string(200000, '['), "f.json", 8); }),
             Equals("f.json: JSON nested more than 8 levels deep"));
  CHECK_THAT(runtime_error_message([] { nn::detail::parse_json("{", "f.json", 8); }), Contains("f.json: invalid JSON"));
}

TEST_CASE("write_atomically replaces a file whole, write_durably creates one, and the memory available is positive") {
  const std::string dir = scratch("write");
  write_atomically(dir + "/x", "first");
  write_atomically(dir + "/x", "second");
  CHECK(read_file(dir + "/x", 100) == "second");
  CHECK_FALSE(std::filesystem::exists(dir + "/x.tmp"));
  write_durably(dir + "/y", "data");
  CHECK(read_file(dir + "/y", 100) == "data");
  CHECK_THAT(runtime_error_message([&] { write_durably(dir + "/missing/y", "data"); }),
             Contains(dir + "/missing/y: creating the file failed"));
  CHECK(available_memory() > 1e8);
}

TEST_CASE("a write that fails leaves no temporary file behind") {
  const std::string dir = scratch("write_fails");
  // Renaming over a folder fails after the whole file is written.
  std::filesystem::create_directories(dir + "/page.html");
  CHECK_THAT(runtime_error_message([&] { write_atomically(dir + "/page.html", "<html>"); }),
             Contains(dir + "/page.html: renaming the temporary file failed"));
  CHECK_FALSE(std::filesystem::exists(dir + "/page.html.tmp"));
  CHECK(std::filesystem::is_directory(dir + "/page.html"));
  // A full disk: the write fails part-way.
  write_atomically(dir + "/x", "old");
  {
    FileSizeLimit full(1000);
    CHECK_THAT(runtime_error_message([&] { write_atomically(dir + "/x", std::string(5000, 'a')); }),
               Contains(dir + "/x: writing failed"));
    CHECK_THAT(runtime_error_message([&] { write_durably(dir + "/y", std::string(5000, 'a')); }),
               Contains(dir + "/y: writing failed"));
  }
  CHECK_FALSE(std::filesystem::exists(dir + "/x.tmp"));
  CHECK_FALSE(std::filesystem::exists(dir + "/y"));
  CHECK(read_file(dir + "/x", 100) == "old");
}
