#include "qkv/nn/checkpoint.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <ostream>
#include <regex>
#include <set>
#include <stdexcept>
#include <system_error>

#include <fmt/format.h>

#include "qkv/core/shape.hpp"
#include "qkv/nn/files.hpp"

namespace qkv::nn {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view prefix = "checkpoint-";

[[noreturn]] void fail_io(const std::string& path, const std::string& what) {
  throw std::runtime_error(fmt::format("{}: {} failed: {}", path, what, std::strerror(errno)));
}

std::string folder_name(std::size_t step) { return fmt::format("{}{:08}", prefix, step); }

// The step of a name "checkpoint-DIGITS", if it is one.
std::optional<std::size_t> step_of(std::string_view name) {
  if (name.substr(0, prefix.size()) != prefix) return std::nullopt;
  return parse_count(name.substr(prefix.size()));
}

// Points DIR/NAME at `target` in one step: a new link, renamed over the old entry.
void link_atomically(const std::string& dir, const std::string& name, const std::string& target) {
  const std::string path = dir + "/" + name, tmp = path + ".tmp";
  std::error_code ignored;
  fs::remove(tmp, ignored);
  if (::symlink(target.c_str(), tmp.c_str()) != 0) fail_io(tmp, "creating a link");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    fs::remove(tmp, ignored);
    errno = error;
    fail_io(path, "renaming the new link");
  }
}

void remove_tree(const std::string& path) {
  std::error_code error;
  fs::remove_all(path, error);
  if (error) throw std::runtime_error(fmt::format("{}: removing failed: {}", path, error.message()));
}

// The step DIR/checkpoint points at, if it is a link to a checkpoint folder.
std::optional<std::size_t> committed_step(const std::string& dir) {
  std::error_code error;
  const fs::path target = fs::read_symlink(dir + "/checkpoint", error);
  if (error) return std::nullopt;
  return step_of(target.string());
}

// Keeps the committed checkpoint and the newest one before it; removes the rest.
void remove_old_checkpoints(const std::string& dir, std::size_t committed) {
  bool kept_previous = false;
  for (const auto& [step, path] : checkpoint_folders(dir)) {
    if (step == committed) continue;
    if (step < committed && !kept_previous) {
      kept_previous = true;
      continue;
    }
    remove_tree(path);
  }
}

// The links DIR/NAME -> checkpoint/NAME through which readers find each file.
void link_files(const std::string& dir, const CheckpointFiles& files) {
  for (const auto& [name, bytes] : files) {
    std::error_code error;
    const fs::path target = fs::read_symlink(dir + "/" + name, error);
    if (error || target != "checkpoint/" + name) link_atomically(dir, name, "checkpoint/" + name);
  }
}

}  // namespace

RunLock::RunLock(const std::string& dir) {
  const std::string path = dir + "/run.lock";
  // A process that replaced the folder (--force) unlinked the lock file we may have opened: the
  // lock holds only while the file we locked is the one at `path`.
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) fail_io(path, "opening the lock");
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      // The holder writes its pid just after it takes the lock: a lock taken a moment ago may not
      // show it yet.
      std::string holder;
      for (int wait = 0; wait < 50 && holder.empty() && error == EWOULDBLOCK; ++wait) {
        if (wait > 0) ::usleep(10'000);
        char pid[32] = {};
        const ssize_t n = ::pread(fd, pid, sizeof pid - 1, 0);
        holder.assign(pid, std::size_t(std::max<ssize_t>(n, 0)));
        holder.erase(std::remove_if(holder.begin(), holder.end(), [](char c) { return c == '\n' || c == ' '; }),
                     holder.end());
      }
      ::close(fd);
      if (error != EWOULDBLOCK) {
        errno = error;
        fail_io(path, "locking");
      }
      throw std::runtime_error(fmt::format("{}: in use by another process (pid {}), which holds {}", dir,
                                           holder.empty() ? "unknown" : holder, path));
    }
    struct stat locked {}, current {};
    if (::fstat(fd, &locked) != 0 || ::stat(path.c_str(), &current) != 0 || locked.st_ino != current.st_ino ||
        locked.st_dev != current.st_dev) {
      ::close(fd);
      continue;
    }
    // Of a fixed width, written over the old one: the file never shows an empty or mixed pid while
    // the lock is held (but for the moment after it is created).
    const std::string pid = fmt::format("{:<15}\n", ::getpid());
    if (::pwrite(fd, pid.data(), pid.size(), 0) != ssize_t(pid.size()) || ::ftruncate(fd, off_t(pid.size())) != 0) {
      const int error = errno;
      ::close(fd);
      errno = error;
      fail_io(path, "writing the lock");
    }
    fd_ = fd;
    return;
  }
  throw std::runtime_error(fmt::format("{}: the lock file keeps being replaced", path));
}

RunLock::~RunLock() {
  if (fd_ < 0) return;
  // Emptied first: a contender that reads the file between the next holder's lock and its pid
  // waits for the pid rather than naming this process.
  [[maybe_unused]] const int ignored = ::ftruncate(fd_, 0);
  ::close(fd_);  // releases the flock
}

RunLock::RunLock(RunLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }

void check_file_links(const std::string& dir, const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    std::error_code error;
    const fs::file_status status = fs::symlink_status(dir + "/" + name, error);
    if (fs::exists(status) && !fs::is_symlink(status) && !fs::is_regular_file(status))
      throw std::runtime_error(fmt::format("{}/{}: is {}, where the run keeps its link to {}; move it away", dir, name,
                                           fs::is_directory(status) ? "a folder" : "not a regular file",
                                           name == "checkpoint" ? "a checkpoint-STEP folder" : "checkpoint/" + name));
  }
}

void commit_checkpoint(const std::string& dir, std::size_t step, const CheckpointFiles& files) {
  const std::string name = folder_name(step), final_path = dir + "/" + name, tmp = final_path + ".tmp";
  if (committed_step(dir) == step)
    throw std::logic_error(fmt::format("commit_checkpoint: {} is committed already", final_path));
  std::vector<std::string> names = {"checkpoint"};
  for (const auto& file : files) names.push_back(file.first);
  check_file_links(dir, names);  // before anything is written: the commit must not fail half-way
  remove_tree(tmp);
  if (::mkdir(tmp.c_str(), 0755) != 0) fail_io(tmp, "creating the folder");
  try {
    for (const auto& [file, bytes] : files) write_durably(tmp + "/" + file, bytes);
    sync_folder(tmp);
    remove_tree(final_path);  // a checkpoint of an abandoned run of steps; never the committed one
    if (std::rename(tmp.c_str(), final_path.c_str()) != 0) fail_io(final_path, "renaming the new checkpoint");
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);  // a full disk stays no fuller than before the save
    throw;
  }
  sync_folder(dir);
  link_atomically(dir, "checkpoint", name);  // the commit
  sync_folder(dir);
  link_files(dir, files);
  remove_old_checkpoints(dir, step);
  sync_folder(dir);
}

std::optional<std::string> committed_checkpoint(const std::string& dir) {
  if (const auto step = committed_step(dir)) return dir + "/" + folder_name(*step);
  std::error_code error;
  const std::string link = dir + "/checkpoint";
  if (const auto status = fs::symlink_status(link, error); fs::exists(status)) {
    const fs::path target = fs::read_symlink(link, error);
    const bool is_link = fs::is_symlink(status);
    throw std::runtime_error(fmt::format("{}: is {}, not a link to one of the run's checkpoint-STEP folders ({})", link,
                                         is_link ? fmt::format("a link to '{}'", target.string()) : "not a link",
                                         is_link ? "a resume repairs it" : "move it away"));
  }
  if (fs::is_regular_file(fs::symlink_status(dir + "/model.safetensors", error))) return dir;  // an older run's layout
  return std::nullopt;
}

std::vector<std::pair<std::size_t, std::string>> checkpoint_folders(const std::string& dir) {
  std::vector<std::pair<std::size_t, std::string>> out;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const auto step = step_of(entry.path().filename().string());
    if (step && entry.is_directory(error) && !entry.is_symlink(error)) out.emplace_back(*step, entry.path().string());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

void recommit_checkpoint(const std::string& dir, std::size_t step) {
  link_atomically(dir, "checkpoint", folder_name(step));
  sync_folder(dir);
}

bool is_partial_file(std::string_view name, const std::vector<std::string>& files) {
  if (name.size() <= 4 || name.substr(name.size() - 4) != ".tmp") return false;
  const std::string_view stem = name.substr(0, name.size() - 4);
  return stem == "checkpoint" || step_of(stem) || std::find(files.begin(), files.end(), stem) != files.end();
}

void remove_partial_files(const std::string& dir, const std::vector<std::string>& files) {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error))
    if (is_partial_file(entry.path().filename().string(), files)) remove_tree(entry.path().string());
}

std::optional<std::size_t> checkpoint_step(const std::string& folder) {
  return step_of(fs::path(folder).filename().string());
}

void replace_folder(const std::string& dir, const std::string& replacement) {
  std::string old = replacement;  // where the old run goes
  if (::renameat2(AT_FDCWD, replacement.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) != 0) {
    if (errno != EINVAL && errno != ENOSYS) fail_io(dir, fmt::format("swapping in {}", replacement));
    // A file system without the exchange: two renames, with a moment where `dir` is missing.
    old = dir + ".old.tmp";
    remove_tree(old);
    if (std::rename(dir.c_str(), old.c_str()) != 0) fail_io(dir, fmt::format("renaming to {}", old));
    if (std::rename(replacement.c_str(), dir.c_str()) != 0) {
      const int error = errno;
      std::rename(old.c_str(), dir.c_str());  // the old run back in its place
      errno = error;
      fail_io(replacement, fmt::format("renaming to {}", dir));
    }
  }
  const fs::path parent = fs::path(dir).parent_path();
  sync_folder(parent.empty() ? "." : parent.string());
  std::error_code ignored;
  fs::remove_all(old, ignored);  // the new run is in place: a leftover of the old one is no fault of it
}

namespace {

std::size_t step_metadata(const Safetensors& f, const std::string& file) {
  const auto it = f.metadata.find("step");
  if (it == f.metadata.end()) throw std::runtime_error(fmt::format("{}: no 'step' in its metadata", file));
  if (const auto step = parse_count(it->second)) return *step;
  throw std::runtime_error(fmt::format("{}: step '{}' is not a number", file, it->second));
}

}  // namespace

void save_checkpoint(const std::string& dir, const Module& model, const StateDict& optimizer_state,
                     const CheckpointInfo& info) {
  std::map<std::string, std::string> metadata = info.metadata;
  metadata["step"] = std::to_string(info.step);
  commit_checkpoint(
      dir, info.step,
      {{"model.safetensors",
        serialize_safetensors(model.state_dict(), {{"step", metadata["step"]}}, dir + "/model.safetensors")},
       {"optimizer.safetensors", serialize_safetensors(optimizer_state, metadata, dir + "/optimizer.safetensors")}});
}

Checkpoint parse_checkpoint(const std::string& folder, Safetensors model, Safetensors optimizer) {
  Checkpoint c{.folder = folder, .info = {}, .model = std::move(model), .optimizer = std::move(optimizer)};
  c.info.step = step_metadata(c.model, folder + "/model.safetensors");
  const std::size_t optimizer_step = step_metadata(c.optimizer, folder + "/optimizer.safetensors");
  if (optimizer_step != c.info.step)
    throw std::runtime_error(fmt::format("{}: the model is from step {} but the optimizer from step {}", folder,
                                         c.info.step, optimizer_step));
  c.info.metadata = c.optimizer.metadata;
  c.info.metadata.erase("step");
  return c;
}

Checkpoint read_checkpoint(const std::string& folder) {
  Checkpoint c = parse_checkpoint(folder, load_safetensors(folder + "/model.safetensors"),
                                  load_safetensors(folder + "/optimizer.safetensors"));
  const auto named = checkpoint_step(folder);  // none for an older run's files directly in its folder
  if (named && *named != c.info.step)
    throw std::runtime_error(fmt::format("{}: its files are from step {}", folder, c.info.step));
  return c;
}

StateDict older_weight_names(StateDict weights, const Module& model) {
  static const std::pair<std::regex, const char*> renames[] = {
      {std::regex(R"(^layers\.(\d+)\.(fc|proj)\.)"), "blocks.$1.mlp.$2."},
      {std::regex(R"(^layers\.(\d+)\.)"), "blocks.$1."},
      {std::regex(R"(^ln_f\.)"), "ln_final."},
      {std::regex(R"(^(encoder|decoder)\.(\d+)\.(fc|proj)\.)"), "$1.blocks.$2.mlp.$3."},
      {std::regex(R"(^decoder\.(\d+)\.self_attn\.)"), "decoder.blocks.$1.attn."},
      {std::regex(R"(^(encoder|decoder)\.(\d+)\.)"), "$1.blocks.$2."},
  };
  std::set<std::string> own;
  for (const auto& [name, tensor] : model.named_parameters()) own.insert(name);
  for (auto& [name, tensor] : weights) {
    if (own.count(name)) continue;
    for (const auto& [from, to] : renames)
      if (std::regex_search(name, from)) {
        std::string renamed = std::regex_replace(name, from, to, std::regex_constants::format_first_only);
        if (own.count(renamed)) name = std::move(renamed);
        break;
      }
  }
  return weights;
}

void load_weights(const Safetensors& weights, const std::string& file, Module& model) {
  try {
    model.load_state_dict(older_weight_names(weights.tensors, model));
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(fmt::format("{}: does not fit the model: {}", file, e.what()));
  }
}

namespace {

std::string committed_folder(const std::string& dir) {
  const auto folder = committed_checkpoint(dir);
  if (!folder) throw std::runtime_error(fmt::format("{}: the run has no checkpoint yet", dir));
  return *folder;
}

}  // namespace

void load_weights(const Checkpoint& c, Module& model) {
  load_weights(c.model, c.folder + "/model.safetensors", model);
}

void load_weights(const std::string& dir, Module& model) {
  const std::string file = committed_folder(dir) + "/model.safetensors";
  load_weights(load_safetensors(file), file, model);
}

Checkpoint load_checkpoint(const std::string& dir, Module& model) {
  Checkpoint c = read_checkpoint(committed_folder(dir));
  load_weights(c, model);
  return c;
}

std::optional<Checkpoint> resume_checkpoint(const std::string& dir,
                                            const std::function<void(const Checkpoint&)>& restore,
                                            std::ostream& notes) {
  check_file_links(dir, {"checkpoint"});  // a folder of the user's there: never replaced by a repair
  // The committed checkpoint, then the older ones, newest first. Newer ones were never committed.
  std::vector<std::string> candidates, faults;
  std::optional<std::string> committed;
  try {
    committed = committed_checkpoint(dir);
  } catch (const std::runtime_error& e) {  // a link to elsewhere: the run's own folders are what is left
    faults.push_back(e.what());
  }
  if (committed) candidates.push_back(*committed);
  const auto committed_step = committed ? checkpoint_step(*committed) : std::nullopt;
  for (const auto& [step, folder] : checkpoint_folders(dir))
    if (!committed || (committed_step && step < *committed_step)) candidates.push_back(folder);
  for (const std::string& folder : candidates) {
    std::optional<Checkpoint> c;
    try {
      c = read_checkpoint(folder);
      restore(*c);
    } catch (const std::runtime_error& e) {
      faults.push_back(e.what());
      continue;
    }
    if (!faults.empty()) {
      notes << fmt::format("resuming from {} (step {}), the newest checkpoint that loads; passed over:\n", folder,
                           c->info.step);
      for (const std::string& fault : faults) notes << "  " << fault << "\n";
      if (const auto step = checkpoint_step(folder)) recommit_checkpoint(dir, *step);
    }
    return c;
  }
  if (faults.empty()) return std::nullopt;
  std::string all;
  for (const std::string& fault : faults) all += "\n  " + fault;
  throw std::runtime_error(fmt::format("{}: no checkpoint loads:{}", dir, all));
}

}  // namespace qkv::nn
