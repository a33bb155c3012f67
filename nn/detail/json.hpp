#pragma once
// JSON from a file, with its nesting bounded: nlohmann::json prints, compares, copies and frees
// values recursively, so a file nested 100,000 deep would overflow the stack in any of them.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

namespace qkv::nn::detail {

// Parses `text`, nested at most `max_depth` arrays or objects deep (a flat object is depth 1);
// anything else throws std::runtime_error naming `file` and the fault.
nlohmann::json parse_json(std::string_view text, const std::string& file, int max_depth);

// Reads an object's fields, each by its type and range; a fault throws std::runtime_error naming
// the file and the field ("FILE: 'model.d_model' is 0, out of range [1, 1000000]").
class FieldReader {
 public:
  FieldReader(const nlohmann::json& j, std::string file, std::string prefix = "")
      : j_(j), file_(std::move(file)), prefix_(std::move(prefix)) {
    if (!j_.is_object()) fail_at("", "is a {}, not an object", j_.type_name());
  }

  const std::string& file() const { return file_; }
  const std::string& prefix() const { return prefix_; }
  bool has(const char* key) const { return j_.contains(key); }
  const nlohmann::json& at(const char* key) const {
    const auto it = j_.find(key);
    if (it == j_.end()) fail_at(key, "is missing");
    return *it;
  }
  // A whole number in [lo, hi]: never a float, which a cast to an integer could not hold.
  std::uint64_t count(const char* key, std::uint64_t lo, std::uint64_t hi) const {
    const nlohmann::json& v = at(key);
    if (v.is_number_unsigned()) {
      const auto n = v.get<std::uint64_t>();
      if (n >= lo && n <= hi) return n;
      fail_at(key, "is {}, out of range [{}, {}]", n, lo, hi);
    }
    if (v.is_number_integer()) fail_at(key, "is {}, out of range [{}, {}]", v.get<std::int64_t>(), lo, hi);
    if (v.is_number()) fail_at(key, "must be a whole number in [{}, {}], not {}", lo, hi, v.dump());
    fail_at(key, "must be a whole number in [{}, {}], not a {}", lo, hi, v.type_name());
  }
  double number(const char* key) const {
    const nlohmann::json& v = at(key);
    if (!v.is_number()) fail_at(key, "must be a number, not a {}", v.type_name());
    return v.get<double>();
  }
  bool flag(const char* key) const {
    const nlohmann::json& v = at(key);
    if (!v.is_boolean()) fail_at(key, "must be true or false, not a {}", v.type_name());
    return v.get<bool>();
  }
  std::string choice(const char* key, const std::vector<std::string>& choices) const {
    const nlohmann::json& v = at(key);
    if (v.is_string() && std::find(choices.begin(), choices.end(), v.get<std::string>()) != choices.end()) return v;
    if (v.is_string() && v.get_ref<const std::string&>().size() <= 40)
      fail_at(key, "is '{}'; it must be one of {}", v.get<std::string>(), fmt::join(choices, ", "));
    fail_at(key, "must be one of {}", fmt::join(choices, ", "));
  }
  // A string of at most `max_size` bytes.
  std::string text(const char* key, std::size_t max_size = 64) const {
    const nlohmann::json& v = at(key);
    if (!v.is_string() || v.get_ref<const std::string&>().size() > max_size)
      fail_at(key, "must be a string of at most {} bytes", max_size);
    return v;
  }
  // Refuses a field the writer does not write, which would otherwise be ignored.
  void only(const nlohmann::json& written) const {
    for (const auto& [key, value] : j_.items())
      if (!written.contains(key)) fail_at(key, "is not a known field");
  }

  template <class... Args>
  [[noreturn]] void fail_at(std::string_view key, fmt::format_string<Args...> text, Args&&... args) const {
    throw std::runtime_error(
        fmt::format("{}: '{}{}' {}", file_, prefix_, key, fmt::format(text, std::forward<Args>(args)...)));
  }

 private:
  const nlohmann::json& j_;
  std::string file_, prefix_;
};

}  // namespace qkv::nn::detail
