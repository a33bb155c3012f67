#include "qkv/training/metrics_log.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "qkv/nn/detail/json.hpp"
#include "qkv/nn/files.hpp"

namespace qkv::training {

namespace fs = std::filesystem;


MetricsLog::MetricsLog(std::string path, bool truncate)
    : path_(std::move(path)),
      out_(std::make_unique<std::ofstream>(path_, truncate ? std::ios::trunc : std::ios::app)) {
  if (!*out_) throw std::runtime_error(fmt::format("{}: cannot open for writing: {}", path_, std::strerror(errno)));
}

void MetricsLog::write(const std::string& line) {
  *out_ << line << '\n' << std::flush;
  if (!*out_) throw std::runtime_error(fmt::format("{}: writing failed: {}", path_, std::strerror(errno)));
}

void truncate_metrics(const std::string& path, std::size_t step, int max_depth) {
  std::error_code missing;
  if (!fs::exists(fs::symlink_status(path, missing))) return;
  const std::string text = nn::read_file(path, std::size_t(1) << 30);
  std::string kept;
  for (std::size_t begin = 0, end; (end = text.find('\n', begin)) != std::string::npos; begin = end + 1) {
    const std::string_view line(text.data() + begin, end - begin + 1);
    // A line past the checkpoint goes, to be written again; a line qkv did not write stays.
    std::optional<std::uint64_t> line_step;
    try {
      const nlohmann::json j = nn::detail::parse_json(line, path, max_depth);
      if (j.is_object() && j.contains("step") && j["step"].is_number_unsigned()) line_step = j["step"].get<std::uint64_t>();
    } catch (const std::runtime_error&) {
    }
    if (!line_step || *line_step <= step) kept += line;
  }
  if (kept != text) nn::write_atomically(path, kept);  // what is left after the last '\n' was cut short
}
}  // namespace qkv::training
