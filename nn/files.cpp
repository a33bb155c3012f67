#include "qkv/nn/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>

#include "qkv/nn/detail/json.hpp"

namespace qkv::nn {

namespace {

[[noreturn]] void fail_io(const std::string& path, const char* what) {
  throw std::runtime_error(fmt::format("{}: {} failed: {}", path, what, std::strerror(errno)));
}

// Closes a file descriptor when it goes out of scope.
struct Descriptor {
  int fd;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
  }
};

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "not a regular file";
}

void write_all(int fd, const std::string& path, std::string_view bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_io(path, "writing");
    done += std::size_t(n);
  }
  if (::fsync(fd) != 0) fail_io(path, "fsync");
}

// Writes `bytes` to a new file `path`, flushes it to disk and closes it; `name` in messages. A
// write that fails (a full disk) removes the file again: nothing half-written stays to fill it.
void write_file(const std::string& path, std::string_view bytes, const std::string& name) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_io(name, "creating the file");
  Descriptor file{fd};
  try {
    write_all(fd, name, bytes);
    file.fd = -1;
    if (::close(fd) != 0) fail_io(name, "close");
  } catch (...) {
    const int error = errno;
    ::unlink(path.c_str());
    errno = error;
    throw;
  }
}

}  // namespace

std::string read_file(const std::string& path, std::size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; the type is checked before any read.
  const Descriptor file{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  if (file.fd < 0) throw std::runtime_error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct stat info {};
  if (::fstat(file.fd, &info) != 0) fail_io(path, "stat");
  if (!S_ISREG(info.st_mode))
    throw std::runtime_error(fmt::format("{}: is {}, not a regular file", path, kind_of(info.st_mode)));
  const auto size = static_cast<std::size_t>(info.st_size);
  if (size > max_bytes)
    throw std::runtime_error(fmt::format("{}: is {} bytes, more than the {} such a file may hold", path, size, max_bytes));
  std::string bytes(size, '\0');
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(file.fd, bytes.data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_io(path, "reading");
    if (n == 0) break;  // the file shrank while being read
    done += std::size_t(n);
  }
  bytes.resize(done);
  return bytes;
}

void write_durably(const std::string& path, std::string_view bytes) { write_file(path, bytes, path); }

void write_atomically(const std::string& path, std::string_view bytes) {
  const std::string tmp = path + ".tmp";
  write_file(tmp, bytes, path);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    errno = error;
    fail_io(path, "renaming the temporary file");
  }
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  sync_folder(dir.empty() ? "." : dir.string());
}

void sync_folder(const std::string& dir) {
  const Descriptor folder{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (folder.fd < 0) fail_io(dir, "opening the folder to flush it");
  // EINVAL: a file system that cannot flush a folder, where there is nothing more to do.
  if (::fsync(folder.fd) != 0 && errno != EINVAL) fail_io(dir, "fsync");
}

double available_memory() {
  double available = double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGE_SIZE));
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemAvailable:") available = kib * 1024;
    meminfo.ignore(64, '\n');
  }
  // A container's limit (cgroup v2), less what the group uses already.
  std::ifstream max("/sys/fs/cgroup/memory.max"), current("/sys/fs/cgroup/memory.current");
  double limit = 0, used = 0;
  if (max >> limit && current >> used) available = std::min(available, std::max(0.0, limit - used));
  return available;
}

namespace detail {

nlohmann::json parse_json(std::string_view text, const std::string& file, int max_depth) {
  struct TooDeep {};
  try {
    return nlohmann::json::parse(text, [max_depth](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
      // depth counts the containers around the value: a nested array or object starts at depth
      // `max_depth` when it would be the (max_depth + 1)th level.
      if ((event == nlohmann::json::parse_event_t::object_start || event == nlohmann::json::parse_event_t::array_start) &&
          depth >= max_depth)
        throw TooDeep{};
      return true;
    });
  } catch (const TooDeep&) {
    throw std::runtime_error(fmt::format("{}: JSON nested more than {} levels deep", file, max_depth));
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(fmt::format("{}: invalid JSON: {}", file, e.what()));
  }
}

}  // namespace detail

}  // namespace qkv::nn
