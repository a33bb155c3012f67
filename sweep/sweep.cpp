#include "qkv/sweep/sweep.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <csignal>
#include <filesystem>
#include <map>
#include <ostream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "qkv/core/runtime.hpp"
#include "qkv/nn/detail/json.hpp"
#include "qkv/nn/files.hpp"
#include "qkv/report/charts.hpp"
#include "qkv/sweep/measure.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/training/options.hpp"
#include "qkv/training/run_options.hpp"
#include "qkv/training/trainer.hpp"

namespace qkv::sweep {

using Json = nlohmann::ordered_json;
namespace fs = std::filesystem;

namespace {

constexpr std::size_t max_file_bytes = 1 << 20;
// Options the file may not give: the sweep decides where a run goes, and the seeds are "seeds".
const char* const sweep_owned[] = {"seed"};

[[noreturn]] void refuse(const std::string& file, const std::string& what) {
  throw std::invalid_argument(fmt::format("{}: {}", file, what));
}

// A value as the option reads it, in one spelling (300, not "300"), so that a run's id and options
// do not depend on how the file wrote them.
Json normalized(const training::RunOption& option, const Json& value) {
  using Kind = training::RunOption::Kind;
  switch (option.kind) {
    case Kind::count:
      return value.is_string() ? Json(std::stoull(value.get<std::string>())) : Json(value.get<std::uint64_t>());
    case Kind::number:
      return value.is_string() ? Json(std::stod(value.get<std::string>())) : Json(value.get<double>());
    case Kind::flag:
      return value.is_boolean() ? value : Json(value == "true");
    case Kind::choice:
    case Kind::masks:
      return value;
  }
  return value;
}

// The option a sweep file's key names, and the key checked as one the file may give.
const training::RunOption& option_of_key(const std::string& file, const std::string& where, const std::string& key) {
  for (const char* owned : sweep_owned)
    if (key == owned) refuse(file, fmt::format("{} '{}': the seeds are given by \"seeds\": {{\"start\": S, \"count\": K}}", where, key));
  const training::RunOption* option = training::find_run_option(key);
  if (!option)
    refuse(file, fmt::format("{} '{}' is not an option of qkv train (one of: {})", where, key,
                             fmt::join([] {
                               std::vector<std::string> names;
                               for (const auto& o : training::run_option_table())
                                 if (o.name != "seed") names.push_back(o.name);
                               return names;
                             }(),
                                       ", ")));
  return *option;
}

Json checked_value(const std::string& file, const std::string& where, const training::RunOption& option, const Json& value) {
  if (const std::string why = training::refusal(option, value); !why.empty()) refuse(file, fmt::format("{}: {}", where, why));
  return normalized(option, value);
}

std::uint64_t fnv1a(const std::string& text) {
  std::uint64_t h = 14695981039346656037ULL;
  for (const unsigned char c : text) h = (h ^ c) * 1099511628211ULL;
  return h;
}

std::string value_text(const Json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

std::string run_id(const std::string& task, const Json& options, const std::vector<std::string>& grid_keys, std::uint64_t seed) {
  std::string id = task;
  for (const std::string& key : grid_keys) id += fmt::format("-{}={}", key, value_text(options.at(key)));
  // Every option, in name order, so that the hash does not depend on the file's order.
  const nlohmann::json canonical = {{"task", task}, {"options", nlohmann::json(options)}, {"seed", seed}};
  return fmt::format("{}-seed{}-{:08x}", id, seed, fnv1a(canonical.dump()) & 0xffffffffULL);
}

// An exclusive lock on a file (flock), taken at once or not at all; released when this goes.
class TryLock {
 public:
  explicit TryLock(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw std::runtime_error(fmt::format("{}: cannot open the run's lock", path));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~TryLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  TryLock(const TryLock&) = delete;
  TryLock& operator=(const TryLock&) = delete;
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

std::string result_path(const std::string& out, const Run& run) { return out + "/results/" + run.id + ".json"; }

}  // namespace

std::optional<Json> result_of(const std::string& out, const Run& run) {
  const std::string path = result_path(out, run);
  std::error_code error;
  if (!fs::exists(path, error)) return std::nullopt;
  const std::string text = nn::read_file(path, 64 << 20);
  nn::detail::parse_json(text, path, 8);  // checked (depth, syntax), then read keeping the order of its keys
  Json j = Json::parse(text);
  if (!j.is_object() || j.value("id", "") != run.id)
    throw std::runtime_error(fmt::format("{}: not the result of run {}", path, run.id));
  return j;
}

namespace {

Json result_head(const Run& run) { return {{"id", run.id}, {"task", run.task}, {"seed", run.seed}, {"options", run.options}}; }

// Trains and measures one run, and writes its result: its numbers, or the error that stopped it.
// `place` is the run's in the list of `total` ("[  3/240] …" in the progress).
bool run_one(const Run& run, std::size_t place, std::size_t total, const std::string& out, const Extras& extras,
             std::ostream& progress) {
  TrainOptions o = run.train;
  o.out = out + "/runs/" + run.id;
  o.force = true;  // a run a killed worker left behind is trained again from the start
  Json result = result_head(run);
  std::vector<std::string> violations;
  std::ostringstream quiet;
  bool ok = true;
  try {
    Json measured;
    measure_run(measured, o, extras, violations, quiet, false);
    result["status"] = "ok";
    result["error"] = nullptr;
    result.update(measured);
    result["violations"] = violations;
  } catch (const training::Interrupted&) {
    throw;  // no result: the run is trained again on the next pass
  } catch (const std::exception& e) {
    ok = false;
    result["status"] = "failed";
    result["error"] = e.what();
  }
  nn::write_atomically(result_path(out, run), result.dump() + "\n");
  // One write a line, so that the lines of parallel workers do not mix.
  const std::string name = fmt::format("[{:>3}/{}] {}", place, total, run.label.empty() ? run.id : run.label);
  progress << (ok ? fmt::format("{}: accuracy {:.4f}, {:.1f} s\n", name, result["accuracy"].get<double>(),
                                result["seconds"].get<double>())
                  : fmt::format("{}: FAILED: {}\n", name, result["error"].get<std::string>()))
           << std::flush;
  return ok;
}

// Whether the run has a result of a run that went to its end; a failed run is tried again.
bool finished(const std::string& out, const Run& run) {
  const std::optional<Json> r = result_of(out, run);
  return r && (*r)["status"] == "ok";
}

// Walks the slice's runs once: each one not finished whose lock is free is run.
WorkerReport walk(const std::vector<Run>& runs, const WorkerOptions& w, std::ostream& progress) {
  WorkerReport report;
  for (std::size_t i = w.index; i < runs.size(); i += w.of) {
    const Run& run = runs[i];
    if (finished(w.out, run)) {
      ++report.finished;
      continue;
    }
    const TryLock lock(w.out + "/runs/" + run.id + ".lock");
    if (!lock.held()) {
      ++report.busy;
      continue;
    }
    if (finished(w.out, run)) {  // finished by another worker while this one looked
      ++report.finished;
      continue;
    }
    ++report.ran;
    if (!run_one(run, i + 1, runs.size(), w.out, w.extras, progress)) ++report.failed;
  }
  return report;
}

}  // namespace

void prepare_folder(const Sweep& sweep, const std::string& out) {
  std::error_code error;
  if (fs::exists(out, error)) {
    if (!fs::is_directory(out, error)) throw training::UsageError(fmt::format("--out {}: is not a folder", out));
    if (!fs::is_empty(out, error) && !fs::exists(out + "/sweep.json", error))
      throw training::UsageError(fmt::format("--out {}: holds files of something other than a sweep (it has no "
                                             "sweep.json); give a new or empty folder",
                                             out));
  }
  fs::create_directories(out + "/runs");
  fs::create_directories(out + "/results");
  // Written when it changes only, so that workers starting together on one folder find it whole.
  const std::string text = sweep.spec.dump(2) + "\n";
  if (!fs::exists(out + "/sweep.json", error) || nn::read_file(out + "/sweep.json", max_file_bytes) != text)
    nn::write_atomically(out + "/sweep.json", text);
}

namespace {

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (const char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

std::string csv(const Sweep& sweep, const Json& results) {
  // The options every run of the sweep has, in the order the first run lists them.
  std::vector<std::string> option_keys;
  for (const Run& run : sweep.runs)
    for (const auto& [key, value] : run.options.items())
      if (std::find(option_keys.begin(), option_keys.end(), key) == option_keys.end()) option_keys.push_back(key);
  std::vector<std::string> metrics = {"status", "accuracy", "steps_to_target", "target", "steps", "seconds",
                                      "sigma_init", "sigma", "score_asymmetry_init", "score_asymmetry", "error"};
  if (std::count(option_keys.begin(), option_keys.end(), "steps")) std::erase(metrics, "steps");  // one column a name
  std::vector<std::string> header = {"id", "task", "seed"};
  header.insert(header.end(), option_keys.begin(), option_keys.end());
  header.insert(header.end(), metrics.begin(), metrics.end());
  std::string out = fmt::format("{}\n", fmt::join(header, ","));
  for (const Json& r : results) {
    std::vector<std::string> cells = {csv_field(r["id"]), csv_field(r["task"]), r["seed"].dump()};
    for (const std::string& key : option_keys)
      cells.push_back(r["options"].contains(key) ? csv_field(value_text(r["options"][key])) : "");
    for (const std::string& key : metrics)
      cells.push_back(!r.contains(key) || r[key].is_null() ? "" : csv_field(value_text(r[key])));
    out += fmt::format("{}\n", fmt::join(cells, ","));
  }
  return out;
}

}  // namespace

Sweep parse_sweep(const Json& spec, const std::string& file) {
  if (!spec.is_object()) refuse(file, fmt::format("a sweep is one JSON object, not {}", spec.type_name()));
  for (const auto& [key, value] : spec.items())
    if (key != "tasks" && key != "grid" && key != "fixed" && key != "seeds" && key != "description")
      refuse(file, fmt::format("unknown key '{}' (a sweep has \"tasks\", \"grid\", \"fixed\", \"seeds\" and "
                               "optionally \"description\")",
                               key));
  if (!spec.contains("tasks")) refuse(file, "'tasks' is missing: the list of tasks to train");
  const Json& tasks = spec["tasks"];
  if (!tasks.is_array() || tasks.empty()) refuse(file, "'tasks' must be a list of one or more task names");
  std::vector<std::string> task_names;
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    if (!tasks[i].is_string()) refuse(file, fmt::format("'tasks'[{}] is {}, not a task name", i, tasks[i].dump()));
    const std::string name = tasks[i];
    try {
      tasks::task_spec(name);
    } catch (const std::invalid_argument& e) {
      refuse(file, fmt::format("'tasks'[{}]: {}", i, e.what()));
    }
    if (std::count(task_names.begin(), task_names.end(), name)) refuse(file, fmt::format("'tasks'[{}]: '{}' is listed twice", i, name));
    task_names.push_back(name);
  }

  Sweep sweep{.file = file, .spec = spec, .grid_keys = {}, .runs = {}};
  Json fixed = Json::object();
  if (spec.contains("fixed")) {
    if (!spec["fixed"].is_object()) refuse(file, "'fixed' must be an object of options and their values");
    for (const auto& [key, value] : spec["fixed"].items()) {
      const training::RunOption& option = option_of_key(file, "'fixed'", key);
      if (fixed.contains(option.name)) refuse(file, fmt::format("'fixed': '{}' is given twice", option.name));
      fixed[option.name] = checked_value(file, fmt::format("'fixed' '{}'", key), option, value);
    }
  }
  std::vector<std::vector<Json>> lists;
  if (spec.contains("grid")) {
    if (!spec["grid"].is_object()) refuse(file, "'grid' must be an object of options and lists of values");
    for (const auto& [key, values] : spec["grid"].items()) {
      const training::RunOption& option = option_of_key(file, "'grid'", key);
      if (fixed.contains(option.name)) refuse(file, fmt::format("'{}' is both in 'grid' and in 'fixed'", option.name));
      if (std::count(sweep.grid_keys.begin(), sweep.grid_keys.end(), option.name))
        refuse(file, fmt::format("'grid': '{}' is given twice", option.name));
      if (!values.is_array() || values.empty()) refuse(file, fmt::format("'grid' '{}' must be a list of one or more values", key));
      std::vector<Json> list;
      for (std::size_t i = 0; i < values.size(); ++i) {
        Json v = checked_value(file, fmt::format("'grid' '{}'[{}]", key, i), option, values[i]);
        if (std::count(list.begin(), list.end(), v)) refuse(file, fmt::format("'grid' '{}'[{}]: {} is listed twice", key, i, v.dump()));
        list.push_back(std::move(v));
      }
      sweep.grid_keys.push_back(option.name);
      lists.push_back(std::move(list));
    }
  }
  std::uint64_t seed_start = 0, seed_count = 1;
  if (spec.contains("seeds")) {
    const Json& seeds = spec["seeds"];
    if (!seeds.is_object()) refuse(file, "'seeds' must be {\"start\": S, \"count\": K}");
    for (const auto& [key, value] : seeds.items())
      if (key != "start" && key != "count") refuse(file, fmt::format("'seeds': unknown key '{}' (it has \"start\" and \"count\")", key));
    const training::RunOption& seed_option = *training::find_run_option("seed");
    if (seeds.contains("start")) seed_start = checked_value(file, "'seeds' 'start'", seed_option, seeds["start"]).get<std::uint64_t>();
    if (seeds.contains("count"))
      seed_count = checked_value(file, "'seeds' 'count'", {.name = "count", .kind = training::RunOption::Kind::count, .help = "", .min = 1, .max = max_runs}, seeds["count"])
                       .get<std::uint64_t>();
    if (seed_count - 1 > UINT64_MAX - seed_start) refuse(file, "'seeds': start + count - 1 is past the largest seed");
  }
  std::size_t total = task_names.size() * seed_count;
  for (const auto& list : lists) {
    if (total > max_runs / list.size()) refuse(file, fmt::format("names more than {} runs", max_runs));
    total *= list.size();
  }
  if (total > max_runs) refuse(file, fmt::format("names more than {} runs", max_runs));

  // Task by task, the grid's product (last key fastest), seed by seed.
  for (const std::string& task : task_names) {
    std::vector<std::size_t> at(lists.size(), 0);
    while (true) {
      Json options = fixed;
      for (std::size_t k = 0; k < lists.size(); ++k) options[sweep.grid_keys[k]] = lists[k][at[k]];
      for (std::uint64_t s = 0; s < seed_count; ++s) {
        Run run{.id = "", .task = task, .options = options, .seed = seed_start + s, .train = {}};
        run.id = run_id(task, options, sweep.grid_keys, run.seed);
        const std::string name = fmt::format("run {}", run.id);
        Json given = nlohmann::json(options);
        given["seed"] = run.seed;
        try {
          run.train = training::run_options(task, given);
          run.train.target = tasks::task_spec(task).target;
          run.train.target_every = 50;
          training::check_options(run.train);
        } catch (const training::RunOptionError& e) {
          refuse(file, fmt::format("{}: '{}' {}", name, e.option, e.what()));
        } catch (const training::OptionError& e) {
          const std::string option = training::option_of_field(e.field);
          refuse(file, fmt::format("{}: '{}' {}", name, option.empty() ? e.field : option, e.what()));
        }
        sweep.runs.push_back(std::move(run));
      }
      std::size_t k = lists.size();
      while (k > 0 && ++at[k - 1] == lists[k - 1].size()) at[--k] = 0;
      if (k == 0) break;
    }
  }
  return sweep;
}

Sweep read_sweep(const std::string& path) {
  const std::string text = nn::read_file(path, max_file_bytes);
  nn::detail::parse_json(text, path, 6);  // checked, then read keeping the file's order (the grid's)
  return parse_sweep(Json::parse(text), path);
}

WorkerReport run_workers(const Sweep& sweep, const WorkerOptions& w, std::ostream& progress) {
  if (w.of == 0 || w.index >= w.of)
    throw training::UsageError(fmt::format("--index {} --of {}: the index must be below the number of slices", w.index, w.of));
  if (w.jobs == 0) throw training::UsageError("-j 0: at least one process");
  prepare_folder(sweep, w.out);
  return run_runs(sweep.runs, w, progress);
}

WorkerReport run_runs(const std::vector<Run>& runs, const WorkerOptions& w, std::ostream& progress) {
  if (w.of == 0 || w.index >= w.of)
    throw training::UsageError(fmt::format("--index {} --of {}: the index must be below the number of slices", w.index, w.of));
  if (w.jobs == 0) throw training::UsageError("-j 0: at least one process");
  training::stop_on_signals();
  set_num_threads(1);  // runs outnumber cores: each single-threaded
  if (w.jobs == 1) return walk(runs, w, progress);

  progress << std::flush;
  std::fflush(nullptr);  // else a child would write again what the parent had not written yet
  std::size_t finished_before = 0;
  for (std::size_t i = w.index; i < runs.size(); i += w.of) finished_before += finished(w.out, runs[i]);
  std::vector<pid_t> children;
  for (std::size_t j = 0; j < w.jobs; ++j) {
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("sweep: cannot start a worker process (fork)");
    if (pid == 0) {  // a child: walks the same slice; the locks share the runs out
      int status = 0;
      try {
        walk(runs, w, progress);
      } catch (const training::Interrupted&) {
        status = 3;
      } catch (const std::exception& e) {
        progress << fmt::format("sweep: worker {}: {}\n", j, e.what()) << std::flush;
        status = 2;
      }
      ::_exit(status);  // its lines were written as they came
    }
    children.push_back(pid);
  }
  bool interrupted = false, broken = false;
  for (const pid_t pid : children) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    interrupted |= WIFEXITED(status) && WEXITSTATUS(status) == 3;
    broken |= !WIFEXITED(status) || WEXITSTATUS(status) == 2;
  }
  if (interrupted) throw training::Interrupted(SIGINT, "sweep: interrupted; the runs in progress are trained again on the next run");
  if (broken) throw std::runtime_error(fmt::format("sweep: a worker process failed; run the sweep again to go on"));
  // What the workers did, from what is in DIR now.
  WorkerReport report{.finished = finished_before};
  for (std::size_t i = w.index; i < runs.size(); i += w.of)
    if (const auto r = result_of(w.out, runs[i])) report.failed += (*r)["status"] != "ok";
    else ++report.busy;  // held by a worker of another machine all along
  std::size_t slice = 0;
  for (std::size_t i = w.index; i < runs.size(); i += w.of) ++slice;
  report.ran = slice - finished_before - report.busy;
  return report;
}

namespace {

// Text a shell reads as one word, whatever it holds.
std::string shell_quoted(const std::string& text) {
  std::string out = "'";
  for (const char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::string slurm_script(const Sweep& sweep, const SlurmOptions& o) {
  if (o.per_task == 0) throw training::UsageError("--per-task 0: a task runs at least one run");
  const std::size_t tasks = (sweep.runs.size() + o.per_task - 1) / o.per_task;
  const std::string out = fs::absolute(o.out).lexically_normal().string();
  std::string script = "#!/bin/bash\n";
  script += fmt::format("# The sweep {} ({} runs) as a Slurm job array: task I runs the I-th of {} slices,\n", sweep.file,
                        sweep.runs.size(), tasks);
  script += fmt::format("# {} run{} each. When every task has ended: qkv sweep {} --out {} --collect\n", o.per_task,
                        o.per_task == 1 ? "" : "s", shell_quoted(out + "/sweep.json"), shell_quoted(out));
  script += fmt::format("#SBATCH --job-name=qkv-sweep\n#SBATCH --array=0-{}{}\n", tasks - 1,
                        o.throttle ? fmt::format("%{}", o.throttle) : "");
  script += fmt::format("#SBATCH --ntasks=1\n#SBATCH --cpus-per-task=1\n#SBATCH --output={}/slurm/%A_%a.out\n", out);
  for (const std::string& line : o.sbatch) {
    if (line.find('\n') != std::string::npos) throw training::UsageError(fmt::format("--sbatch '{}': one line, please", line));
    script += "#SBATCH " + line + "\n";
  }
  script += fmt::format("exec {} sweep {} --out {} --index \"$SLURM_ARRAY_TASK_ID\" --of {} -j 1\n", shell_quoted(o.program),
                        shell_quoted(out + "/sweep.json"), shell_quoted(out), tasks);
  return script;
}

std::string write_slurm_script(const Sweep& sweep, const SlurmOptions& o) {
  const std::string text = slurm_script(sweep, o);  // checked before the folder is touched
  prepare_folder(sweep, o.out);
  fs::create_directories(o.out + "/slurm");
  const std::string path = o.out + "/sweep.sbatch";
  nn::write_atomically(path, text);
  fs::permissions(path, fs::perms::owner_exec | fs::perms::group_exec | fs::perms::others_exec, fs::perm_options::add);
  return path;
}

std::pair<double, double> wilson_interval(std::size_t k, std::size_t n) {
  if (n == 0) return {0, 1};
  const double z = 1.959963984540054, p = double(k) / double(n), N = double(n);
  const double centre = (p + z * z / (2 * N)) / (1 + z * z / N);
  const double half = z * std::sqrt(p * (1 - p) / N + z * z / (4 * N * N)) / (1 + z * z / N);
  // At k = 0 and k = n the bound is 0 or 1 exactly (centre ∓ half cancel; rounding would not).
  return {k == 0 ? 0.0 : std::max(0.0, centre - half), k == n ? 1.0 : std::min(1.0, centre + half)};
}

std::string summary_table(const Sweep& sweep, const Json& results) {
  // Configurations in the sweep's order: the task and the grid's values.
  std::vector<std::string> order;
  std::map<std::string, std::vector<const Json*>> groups;
  const auto label = [&](const Json& r) {
    std::vector<std::string> parts = {r["task"].get<std::string>()};
    for (const std::string& key : sweep.grid_keys) parts.push_back(value_text(r["options"][key]));
    return fmt::format("{}", fmt::join(parts, " | "));
  };
  for (const Json& r : results) {
    const std::string l = label(r);
    if (!groups.count(l)) order.push_back(l);
    groups[l].push_back(&r);
  }
  std::vector<std::string> header = {"task"};
  header.insert(header.end(), sweep.grid_keys.begin(), sweep.grid_keys.end());
  header.insert(header.end(), {"runs", "failed", "accuracy (mean ± sd)", "reached the target (95% Wilson)"});
  std::string out = fmt::format("| {} |\n|{}\n", fmt::join(header, " | "), [&] {
    std::string s;
    for (std::size_t i = 0; i < header.size(); ++i) s += "---|";
    return s;
  }());
  for (const std::string& l : order) {
    std::vector<double> accuracy;
    std::size_t failed = 0, reached = 0;
    double target = 0;
    for (const Json* r : groups[l]) {
      if ((*r)["status"] != "ok") {
        ++failed;
        continue;
      }
      accuracy.push_back((*r)["accuracy"].get<double>());
      target = (*r)["target"].get<double>();
      reached += accuracy.back() >= target;
    }
    const report::Stats s = report::stats(accuracy);
    const auto [lo, hi] = wilson_interval(reached, accuracy.size());
    out += fmt::format("| {} | {} | {} | {} | {} |\n", l, groups[l].size(), failed,
                       s.n == 0 ? std::string("-") : fmt::format("{:.3f} ± {:.3f} (n = {})", s.mean, s.sd, s.n),
                       s.n == 0 ? std::string("-")
                                : fmt::format("{} of {} at {:.0f}% ({:.0f}–{:.0f}%)", reached, s.n, 100 * target,
                                              100 * lo, 100 * hi));
  }
  return out;
}

Collected collect(const Sweep& sweep, const std::string& out, bool partial) {
  Collected c;
  c.results = Json::array();
  for (const Run& run : sweep.runs) {
    std::optional<Json> r = result_of(out, run);
    if (!r) {
      c.missing.push_back(run.id);
      continue;
    }
    c.failed += (*r)["status"] != "ok";
    c.results.push_back(std::move(*r));
  }
  if (!c.missing.empty() && !partial) {
    const std::size_t shown = std::min<std::size_t>(c.missing.size(), 5);
    throw std::runtime_error(fmt::format("{}: {} of {} runs have no result yet ({}{}); run the sweep to finish them, or "
                                         "give --partial to merge what there is",
                                         out, c.missing.size(), sweep.runs.size(),
                                         fmt::join(c.missing.begin(), c.missing.begin() + std::ptrdiff_t(shown), ", "),
                                         c.missing.size() > shown ? ", …" : ""));
  }
  std::string lines;
  for (const Json& r : c.results) lines += r.dump() + "\n";
  c.summary = summary_table(sweep, c.results);
  nn::write_atomically(out + "/results.jsonl", lines);
  nn::write_atomically(out + "/results.csv", csv(sweep, c.results));
  nn::write_atomically(out + "/summary.md", c.summary);
  return c;
}

}  // namespace qkv::sweep
