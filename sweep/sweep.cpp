#include "qkv/sweep/sweep.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <csignal>
#include <filesystem>
#include <map>
#include <set>
#include <ostream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "qkv/core/runtime.hpp"
#include "qkv/nn/detail/json.hpp"
#include "qkv/nn/files.hpp"
#include "qkv/report/charts.hpp"
#include "qkv/sweep/measure.hpp"
#include "qkv/sweep/measurements.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/training/memory.hpp"
#include "qkv/training/options.hpp"
#include "qkv/training/run_options.hpp"
#include "qkv/training/trainer.hpp"

namespace qkv::sweep {

using Json = nlohmann::ordered_json;
namespace fs = std::filesystem;

namespace {

constexpr std::size_t max_file_bytes = 1 << 20;
// Options of `qkv train` the file may not give: the sweep decides where a run goes, whether it
// replaces one, and its threads; the seeds are "seeds".
const char* const sweep_owned[] = {"out", "force", "resume", "threads"};

[[noreturn]] void refuse(const std::string& file, const std::string& what) {
  throw std::invalid_argument(fmt::format("{}: {}", file, what));
}

// The option a sweep file's key names, and the key checked as one the file may give.
const training::RunOption& option_of_key(const std::string& file, const std::string& where, const std::string& key) {
  if (key == "seed") refuse(file, fmt::format("{} '{}': the seeds are given by \"seeds\": {{\"start\": S, \"count\": K}}", where, key));
  for (const char* owned : sweep_owned)
    if (key == owned) refuse(file, fmt::format("{} '{}': the sweep decides it (each run in DIR/runs/ID, one thread)", where, key));
  const training::RunOption* option = training::find_run_option(key);
  if (!option) {
    std::vector<std::string> names;
    for (const auto& o : training::run_option_table())
      if (o.name != "seed") names.push_back(o.name);
    refuse(file, fmt::format("{} '{}' is not an option of qkv train (one of: {})", where, key, fmt::join(names, ", ")));
  }
  return *option;
}

Json checked_value(const std::string& file, const std::string& where, const training::RunOption& option, const Json& value) {
  if (const std::string why = training::refusal(option, value); !why.empty()) refuse(file, fmt::format("{}: {}", where, why));
  return training::normalized_value(option, value);
}

std::uint64_t fnv1a(const std::string& text) {
  std::uint64_t h = 14695981039346656037ULL;
  for (const unsigned char c : text) h = (h ^ c) * 1099511628211ULL;
  return h;
}

// A value in full: a string as it is, anything else as JSON.
std::string plain_text(const Json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// `name` (the task, its options and the grid's values) with the seed and a hash of every option in
// name order, so that the hash does not depend on the file's order.
std::string run_id(const std::string& name, const std::string& task, const Json& options, std::uint64_t seed) {
  const nlohmann::json canonical = {{"task", task}, {"options", nlohmann::json(options)}, {"seed", seed}};
  return fmt::format("{}-seed{}-{:08x}", name, seed, fnv1a(canonical.dump()) & 0xffffffffULL);
}

// What every run of a sweep records beyond the options it is given: a checkpoint at its end only
// (unless the file sets checkpoint-every), ten lines of metrics (unless it sets log-every), and the
// steps to the task's target measured every 50 steps (25 in runs of 300 steps or fewer).
void apply_sweep_rules(TrainOptions& o, const Json& given) {
  if (!given.contains("checkpoint-every")) o.checkpoint_every = o.steps;
  if (!given.contains("log-every")) o.log_every = std::max<std::size_t>(1, o.steps / 10);
  o.target = tasks::task_spec(o.task).target;
  o.target_every = o.steps <= 300 ? 25 : 50;
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
  const auto bad = [&](const std::string& why) {
    throw std::runtime_error(fmt::format("{}: {} (remove it, and the run is trained again)", path, why));
  };
  if (!j.is_object()) bad("not a run's result: not a JSON object");
  if (!j.contains("id") || j["id"] != run.id) bad(fmt::format("'id' is not {}", run.id));
  const auto need = [&](const char* key, bool ok, const char* what) {
    if (!j.contains(key) || !ok) bad(fmt::format("'{}' {}", key, j.contains(key) ? "is not " + std::string(what) : "is missing"));
  };
  need("task", j.contains("task") && j["task"].is_string(), "a task name");
  need("seed", j.contains("seed") && j["seed"].is_number_unsigned(), "a seed");
  need("options", j.contains("options") && j["options"].is_object(), "an object");
  need("pass", j.contains("pass") && j["pass"].is_string(), "a pass's token");
  need("status", j.contains("status") && (j["status"] == "ok" || j["status"] == "failed"), "\"ok\" or \"failed\"");
  if (j["status"] == "failed") {
    need("error", j.contains("error") && j["error"].is_string(), "a message");
    return j;
  }
  for (const char* key : {"accuracy", "target", "seconds"}) need(key, j.contains(key) && j[key].is_number(), "a number");
  need("steps_to_target", j.contains("steps_to_target") && (j["steps_to_target"].is_null() || j["steps_to_target"].is_number_unsigned()),
       "a step or null");
  need("violations", j.contains("violations") && j["violations"].is_array(), "a list");
  for (const Json& v : j["violations"])
    if (!v.is_string()) bad("'violations' holds something other than messages");
  return j;
}

const std::vector<std::string>& result_head_keys() {
  static const std::vector<std::string> keys = {"id", "task", "labels", "seed", "options", "pass", "status", "error", "violations"};
  return keys;
}

namespace {

Json result_head(const Run& run) {
  return {{"id", run.id}, {"task", run.task}, {"labels", run.labels}, {"seed", run.seed}, {"options", run.options}};
}

// Trains and measures one run, and writes its result: its numbers, or the error that stopped it.
// `place` is the run's in the list of `total` ("[  3/240] …" in the progress). A result that
// cannot be written (a full disk) is said, and the run is trained again on the next pass.
bool run_one(const Run& run, std::size_t place, std::size_t total, const WorkerOptions& w, const std::string& pass,
             std::ostream& progress) {
  TrainOptions o = run.train;
  o.out = w.out + "/runs/" + run.id;
  // A run a stopped worker left part way goes on from its checkpoint, where its curve's points up to
  // there were kept; any other is trained again from the start.
  const std::string curve_file = w.out + "/runs/" + run.id + ".curve.jsonl";
  const std::string name = fmt::format("[{:>3}/{}] {}", place, total, run.label.empty() ? run.id : run.label);
  if (const std::optional<std::size_t> from = resumable_step(o, curve_file)) {
    o.resume = true;
    progress << fmt::format("{}: goes on from its checkpoint of step {}\n", name, *from) << std::flush;
  } else {
    o.force = true;
  }
  Json result = result_head(run);
  result["pass"] = pass;
  std::vector<std::string> violations;
  std::ostringstream quiet;
  bool ok = true;
  try {
    Json measured;
    const bool shown = w.show_training && w.jobs == 1;
    measure_run(measured, o, w.extras, violations, shown ? progress : quiet, shown, curve_file);
    result["status"] = "ok";
    result["error"] = nullptr;
    result.update(measured);
    result["violations"] = violations;
  } catch (const training::Interrupted&) {
    throw;  // no result: the next pass goes on from the checkpoint the stop committed
  } catch (const std::exception& e) {
    ok = false;
    result["status"] = "failed";
    result["error"] = e.what();
  }
  try {
    nn::write_atomically(result_path(w.out, run), result.dump() + "\n");
  } catch (const std::exception& e) {
    progress << fmt::format("{}: its result was not written, and it is trained again on the next pass: {}\n", name, e.what())
             << std::flush;
    return false;
  }
  std::error_code gone;
  std::filesystem::remove(curve_file, gone);  // its points are in the result now
  // One write a line, so that the lines of parallel workers do not mix.
  progress << (ok ? fmt::format("{}: accuracy {:.4f}, {}, {:.1f} s\n", name, result["accuracy"].get<double>(),
                                result["steps_to_target"].is_null()
                                    ? std::string("target not reached")
                                    : fmt::format("target at step {}", result["steps_to_target"].get<std::size_t>()),
                                result["seconds"].get<double>())
                  : fmt::format("{}: FAILED: {}\n", name, result["error"].get<std::string>()))
           << std::flush;
  return ok;
}

// Whether the run has nothing left to do in this pass: a result of a run that went to its end, or
// of one that failed in this pass (a failed run is tried once a pass).
bool finished(const std::string& out, const Run& run, const std::string& pass) {
  const std::optional<Json> r = result_of(out, run);
  return r && ((*r)["status"] == "ok" || (*r)["pass"] == pass);
}

// Walks the slice's runs once: each one not finished whose lock is free is run. With
// stop_on_failure, it stops at the first run that fails.
WorkerReport walk(const std::vector<Run>& runs, const WorkerOptions& w, const std::string& pass, std::ostream& progress) {
  WorkerReport report;
  for (std::size_t i = w.index; i < runs.size(); i += w.of) {
    const Run& run = runs[i];
    if (finished(w.out, run, pass)) {
      ++report.finished;
      continue;
    }
    const TryLock lock(w.out + "/runs/" + run.id + ".lock");
    if (!lock.held()) {
      ++report.busy;
      continue;
    }
    if (finished(w.out, run, pass)) {  // finished by another worker while this one looked
      ++report.finished;
      continue;
    }
    ++report.ran;
    if (!run_one(run, i + 1, runs.size(), w, pass, progress)) {
      ++report.failed;
      if (w.stop_on_failure) break;
    }
  }
  return report;
}

void check_worker(const WorkerOptions& w) {
  if (w.of == 0 || w.index >= w.of)
    throw training::UsageError(fmt::format("--index {} --of {}: the index must be below the number of slices", w.index, w.of));
  if (w.jobs == 0) throw training::UsageError("-j 0: at least one process");
}

// An exclusive lock on DIR/sweep.lock, waited for: one worker at a time prepares or merges.
class FolderLock {
 public:
  explicit FolderLock(const std::string& dir) {
    const std::string path = dir + "/sweep.lock";
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw std::runtime_error(fmt::format("{}: cannot open the sweep's lock", path));
    while (::flock(fd_, LOCK_EX) != 0)
      if (errno != EINTR) throw std::runtime_error(fmt::format("{}: cannot take the sweep's lock", path));
  }
  ~FolderLock() { ::close(fd_); }
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  int fd_ = -1;
};

// Whether a folder holds only what a sweep that is starting there has made yet.
bool only_sweep_entries(const std::string& dir) {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name != "sweep.lock" && name != "runs" && name != "results") return false;
  }
  return true;
}

}  // namespace

void prepare_folder(const Sweep& sweep, const std::string& out) {
  std::error_code error;
  // Checked before anything is written: a folder of the user's own stays as it is.
  const auto check = [&] {
    if (!fs::exists(out, error)) return;
    if (!fs::is_directory(out, error)) throw training::UsageError(fmt::format("--out {}: is not a folder", out));
    if (!fs::exists(out + "/sweep.json", error) && !only_sweep_entries(out))
      throw training::UsageError(fmt::format("--out {}: holds files of something other than a sweep (it has no "
                                             "sweep.json); give a new or empty folder",
                                             out));
  };
  check();
  fs::create_directories(out);
  const FolderLock lock(out);  // workers starting together on one folder: one at a time
  check();
  // Written when it changes only, first, so that a folder with runs/ has its sweep.json.
  const std::string text = sweep.spec.dump(2) + "\n";
  if (!fs::exists(out + "/sweep.json", error) || nn::read_file(out + "/sweep.json", max_file_bytes) != text)
    nn::write_atomically(out + "/sweep.json", text);
  fs::create_directories(out + "/runs");
  fs::create_directories(out + "/results");
}

namespace {

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (const char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

std::string csv(const Sweep& sweep, const Json& results) {
  const ResultsTable table = results_table(sweep, results);
  std::string out = fmt::format("{}\n", fmt::join(table.columns, ","));
  for (const std::vector<Json>& row : table.rows) {
    std::vector<std::string> cells;
    for (const Json& v : row) cells.push_back(v.is_null() ? "" : csv_field(plain_text(v)));
    out += fmt::format("{}\n", fmt::join(cells, ","));
  }
  return out;
}

}  // namespace

ResultsTable results_table(const Sweep& sweep, const Json& results) {
  // The options every run of the sweep has, in the order the first run lists them; the task's label
  // where one differs from its task, and the names of named settings.
  std::vector<std::string> option_keys, label_keys;
  bool task_labels = false;
  for (const Run& run : sweep.runs) {
    for (const auto& [key, value] : run.options.items())
      if (std::find(option_keys.begin(), option_keys.end(), key) == option_keys.end()) option_keys.push_back(key);
    task_labels |= run.labels["task"] != run.task;
  }
  const Json none = Json::object();
  const Json& grid = sweep.spec.contains("grid") ? sweep.spec.at("grid") : none;
  for (const std::string& key : sweep.grid_keys)  // named settings
    if (grid.contains(key) && grid.at(key).is_object()) label_keys.push_back(key);
  std::vector<std::string> metrics = {"status", "accuracy", "steps_to_target", "target", "steps", "seconds",
                                      "sigma_init", "sigma", "score_asymmetry_init", "score_asymmetry"};
  for (const std::string& name : sweep.measurements)
    for (const tasks::Column& c : measurement(name).columns) metrics.push_back(c.key);
  metrics.push_back("error");
  std::vector<std::string> header = {"id", "task"};
  if (task_labels) header.push_back("task_label");
  header.push_back("seed");
  header.insert(header.end(), label_keys.begin(), label_keys.end());
  header.insert(header.end(), option_keys.begin(), option_keys.end());  // a sweep's file has no option named as its settings
  for (const std::string& key : metrics)
    if (!std::count(header.begin(), header.end(), key)) header.push_back(key);
  ResultsTable table{.columns = header, .rows = {}};
  static const Json null;
  for (const Json& r : results) {
    const Json& labels = r.at("labels");
    const Json& options = r.at("options");
    std::vector<Json>& cells = table.rows.emplace_back();
    for (const std::string& key : header) {
      const Json* v = key == "task_label"                                                       ? &labels.at("task")
                      : key == "id" || key == "task" || key == "seed"                            ? &r.at(key)
                      : std::count(label_keys.begin(), label_keys.end(), key) && labels.contains(key) ? &labels.at(key)
                      : options.contains(key)                                                    ? &options.at(key)
                                                                                                 : report::value_at(r, key);
      cells.push_back(v ? *v : null);
    }
  }
  return table;
}


namespace {

// The keys of a result and the columns of results.csv, which a name of settings may not take.
const std::vector<std::string>& reserved_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k = result_head_keys();
    for (const char* more : {"task_label", "accuracy", "steps_to_target", "target", "steps", "seconds", "sigma_init", "sigma",
                             "score_asymmetry_init", "score_asymmetry", "curve", "config"})
      k.push_back(more);
    return k;
  }();
  return keys;
}

// A grid key's values: an option's values, or named settings ({"tied": {"qk": "tied"}, …}).
struct Axis {
  std::string key;     // as the file writes it: the label's key
  std::string option;  // the option a list of values sets ("" for named settings)
  std::vector<std::pair<Json, Json>> values;  // (its label, the options it sets)
};

// A task entry: a name, or {"task": NAME, "label": TEXT, OPTION: VALUE, …}.
struct TaskEntry {
  std::string task, label, id;  // id: the task and its options, as the run ids begin
  Json options = Json::object();
};

// A label as a part of a file name: characters other than letters, digits and . _ , + = - become _.
std::string id_text(const std::string& text) {
  std::string out = text;
  for (char& c : out)
    if (!std::isalnum(static_cast<unsigned char>(c)) && !std::strchr("._,+=-", c)) c = '_';
  return out;
}

// Options the file gives at `where` ({"qk": "tied", …}), checked and by the table's names.
Json checked_options(const std::string& file, const std::string& where, const Json& given) {
  if (!given.is_object()) refuse(file, fmt::format("{} must be an object of options and their values", where));
  Json out = Json::object();
  for (const auto& [key, value] : given.items()) {
    const training::RunOption& option = option_of_key(file, where, key);
    if (out.contains(option.name)) refuse(file, fmt::format("{}: '{}' is given twice", where, option.name));
    out[option.name] = checked_value(file, fmt::format("{} '{}'", where, key), option, value);
  }
  return out;
}

std::vector<TaskEntry> task_entries(const std::string& file, const Json& tasks) {
  if (!tasks.is_array() || tasks.empty()) refuse(file, "'tasks' must be a list of one or more task names");
  std::vector<TaskEntry> entries;
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    const std::string where = fmt::format("'tasks'[{}]", i);
    TaskEntry e;
    if (tasks[i].is_object()) {
      Json given = tasks[i];
      if (!given.contains("task") || !given["task"].is_string())
        refuse(file, fmt::format("{}: an object names its task (\"task\": NAME) beside its options", where));
      e.task = given["task"];
      given.erase("task");
      if (given.contains("label")) {
        if (!given["label"].is_string() || given["label"].get<std::string>().empty() || given["label"].get<std::string>().size() > 100)
          refuse(file, fmt::format("{} 'label' must be text of 1 to 100 bytes", where));
        e.label = given["label"];
        given.erase("label");
      }
      e.options = checked_options(file, where, given);
    } else if (tasks[i].is_string()) {
      e.task = tasks[i];
    } else {
      refuse(file, fmt::format("{} is {}, not a task name or {{\"task\": NAME, OPTION: VALUE, …}}", where, tasks[i].dump()));
    }
    try {
      tasks::task_spec(e.task);
    } catch (const std::invalid_argument& error) {
      refuse(file, fmt::format("{}: {}", where, error.what()));
    }
    e.id = e.task;
    std::string described = e.task;
    for (const auto& [key, value] : e.options.items()) {
      e.id += fmt::format("-{}={}", key, id_text(plain_text(value)));
      described += fmt::format(" {}={}", key, plain_text(value));
    }
    if (e.label.empty()) e.label = described;
    for (std::size_t j = 0; j < entries.size(); ++j) {
      if (entries[j].label == e.label) refuse(file, fmt::format("{}: '{}' is listed twice", where, e.label));
      if (entries[j].id == e.id)
        refuse(file, fmt::format("{}: trains the task and options of 'tasks'[{}] ('{}') again", where, j, entries[j].label));
    }
    entries.push_back(std::move(e));
  }
  return entries;
}

std::vector<Axis> grid_axes(const std::string& file, const Json& grid) {
  if (!grid.is_object()) refuse(file, "'grid' must be an object of options and lists of values (or of named settings)");
  std::vector<Axis> axes;
  for (const auto& [key, values] : grid.items()) {
    Axis axis{.key = key, .option = "", .values = {}};
    const std::string where = fmt::format("'grid' '{}'", key);
    if (values.is_object()) {  // named settings
      if (values.empty()) refuse(file, fmt::format("{} must name one or more settings", where));
      if (key.empty() || key.size() > 40) refuse(file, fmt::format("{}: a name of settings is 1 to 40 bytes", where));
      if (std::count(reserved_keys().begin(), reserved_keys().end(), key))
        refuse(file, fmt::format("{}: a result has a key of that name; give the settings another", where));
      for (const auto& [name, options] : values.items()) {
        if (name.empty() || name.size() > 40) refuse(file, fmt::format("{}: the name '{}' is not 1 to 40 bytes", where, name));
        axis.values.emplace_back(name, checked_options(file, fmt::format("{} '{}'", where, name), options));
      }
    } else {
      const training::RunOption& option = option_of_key(file, "'grid'", key);
      axis.option = option.name;
      if (!values.is_array() || values.empty())
        refuse(file, fmt::format("{} must be a list of one or more values, or an object of named settings", where));
      for (std::size_t i = 0; i < values.size(); ++i) {
        Json v = checked_value(file, fmt::format("{}[{}]", where, i), option, values[i]);
        for (const auto& [label, set] : axis.values)
          if (label == v) refuse(file, fmt::format("{}[{}]: {} is listed twice", where, i, v.dump()));
        axis.values.emplace_back(v, Json{{option.name, v}});
      }
    }
    for (const Axis& other : axes)
      if (other.key == axis.key || (!axis.option.empty() && other.option == axis.option))
        refuse(file, fmt::format("{}: '{}' is given twice", where, axis.option.empty() ? key : axis.option));
    axes.push_back(std::move(axis));
  }
  return axes;
}

}  // namespace

Sweep parse_sweep(const Json& spec, const std::string& file) {
  if (!spec.is_object()) refuse(file, fmt::format("a sweep is one JSON object, not {}", spec.type_name()));
  for (const auto& [key, value] : spec.items())
    if (key != "tasks" && key != "grid" && key != "fixed" && key != "seeds" && key != "measure" && key != "description")
      refuse(file, fmt::format("unknown key '{}' (a sweep has \"tasks\", \"grid\", \"fixed\", \"seeds\" and "
                               "optionally \"measure\" and \"description\")",
                               key));
  if (spec.contains("description") && !spec["description"].is_string()) refuse(file, "'description' must be text");
  if (!spec.contains("tasks")) refuse(file, "'tasks' is missing: the list of tasks to train");
  const std::vector<TaskEntry> entries = task_entries(file, spec["tasks"]);

  Sweep sweep{.file = file, .spec = spec, .grid_keys = {}, .measurements = {}, .runs = {}};
  const Json fixed = spec.contains("fixed") ? checked_options(file, "'fixed'", spec["fixed"]) : Json::object();
  const std::vector<Axis> axes = spec.contains("grid") ? grid_axes(file, spec["grid"]) : std::vector<Axis>{};
  for (const Axis& axis : axes) sweep.grid_keys.push_back(axis.key);
  if (spec.contains("measure")) {
    const Json& measure = spec["measure"];
    if (!measure.is_array()) refuse(file, "'measure' must be a list of measurements' names");
    for (std::size_t i = 0; i < measure.size(); ++i) {
      if (!measure[i].is_string()) refuse(file, fmt::format("'measure'[{}] is {}, not a measurement's name", i, measure[i].dump()));
      try {
        measurement(measure[i]);
      } catch (const std::invalid_argument& e) {
        refuse(file, fmt::format("'measure'[{}]: {}", i, e.what()));
      }
      if (std::count(sweep.measurements.begin(), sweep.measurements.end(), measure[i])) refuse(file, fmt::format("'measure'[{}]: '{}' is listed twice", i, measure[i].get<std::string>()));
      sweep.measurements.push_back(measure[i]);
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
  if (spec.dump(2).size() + 1 > max_file_bytes)
    refuse(file, fmt::format("is larger than {} bytes written out (DIR/sweep.json, which a job's tasks read)", max_file_bytes));
  std::size_t total = entries.size() * seed_count;
  for (const Axis& axis : axes) {
    if (total > max_runs / axis.values.size()) refuse(file, fmt::format("names more than {} runs", max_runs));
    total *= axis.values.size();
  }
  if (total > max_runs) refuse(file, fmt::format("names more than {} runs", max_runs));

  // Task by task, the grid's product (last key fastest), seed by seed.
  std::set<std::string> ids;
  for (std::size_t t = 0; t < entries.size(); ++t) {
    const TaskEntry& entry = entries[t];
    std::vector<std::size_t> at(axes.size(), 0);
    while (true) {
      // Each option from one place only: where each came from, to name both when two give it.
      Json options = Json::object(), labels = {{"task", entry.label}};
      std::map<std::string, std::string> from;
      const auto add = [&](const Json& given, const std::string& where) {
        for (const auto& [key, value] : given.items()) {
          if (from.count(key)) refuse(file, fmt::format("{} sets '{}', which {} sets too", where, key, from[key]));
          from[key] = where;
          options[key] = value;
        }
      };
      add(fixed, "'fixed'");
      add(entry.options, fmt::format("'tasks'[{}]", t));
      std::string id = entry.id;
      for (std::size_t k = 0; k < axes.size(); ++k) {
        const auto& [label, set] = axes[k].values[at[k]];
        add(set, axes[k].option.empty() ? fmt::format("'grid' '{}' '{}'", axes[k].key, label.get<std::string>())
                                        : fmt::format("'grid' '{}'", axes[k].key));
        labels[axes[k].key] = label;
        id += fmt::format("-{}={}", axes[k].option.empty() ? id_text(axes[k].key) : axes[k].option, id_text(plain_text(label)));
      }
      for (const Axis& axis : axes)
        if (const training::RunOption* o = training::find_run_option(axis.key); axis.option.empty() && o && options.contains(o->name))
          refuse(file, fmt::format("'grid' '{}' names settings, and {} sets the option '{}': give the settings another "
                                   "name",
                                   axis.key, from[o->name], o->name));
      TrainOptions trained;  // the configuration's, checked once: its runs differ in their seed alone
      for (std::uint64_t s = 0; s < seed_count; ++s) {
        Run run{.id = "", .task = entry.task, .labels = labels, .options = options, .seed = seed_start + s, .train = {}};
        run.id = run_id(id, entry.task, options, run.seed);
        const std::string name = fmt::format("run {}", run.id);
        if (run.id.size() > 200)  // a file name: ID.json.tmp, ID.lock
          refuse(file, fmt::format("{}: the id is {} bytes, more than 200: shorten the grid's values", name, run.id.size()));
        if (!ids.insert(run.id).second)
          refuse(file, fmt::format("{}: two runs have this id (the same options, under names that differ only in "
                                   "characters a file name may not hold)",
                                   name));
        if (s == 0) try {  // named by its first run
            trained = training::run_options(entry.task, options);
            apply_sweep_rules(trained, options);
            training::check_options(trained);
            for (const std::string& m : sweep.measurements) {
              const Measurement& measured = measurement(m);
              const bool decoder_only = measured.extras.at_init || measured.extras.at_end || measured.extras.of_folder;
              if (trained.encoder_layers && !measured.extras.seq2seq_at_end)
                refuse(file, fmt::format("{}: 'measure' '{}' measures decoder-only models, and {} trains an encoder-decoder",
                                         name, m, entry.task));
              if (!trained.encoder_layers && !decoder_only)
                refuse(file, fmt::format("{}: 'measure' '{}' measures seq2seq runs, and {} trains a decoder-only model", name,
                                         m, entry.task));
              if (measured.check)
                if (const std::string why = measured.check(trained); !why.empty())
                  refuse(file, fmt::format("{}: 'measure' '{}': {}", name, m, why));
            }
          } catch (const training::RunOptionError& e) {
            refuse(file, fmt::format("{}: '{}' {}", name, e.option, e.what()));
          } catch (const training::OptionError& e) {
            const std::string option = training::option_of_field(e.field);
            refuse(file, fmt::format("{}: '{}' {}", name, option.empty() ? e.field : option, e.what()));
          }
        run.train = trained;
        run.train.seed = run.seed;
        sweep.runs.push_back(std::move(run));
      }
      std::size_t k = axes.size();
      while (k > 0 && ++at[k - 1] == axes[k - 1].values.size()) at[--k] = 0;
      if (k == 0) break;
    }
  }
  return sweep;
}

Json read_sweep_file(const std::string& path) {
  const std::string text = nn::read_file(path, max_file_bytes);
  nn::detail::parse_json(text, path, 6);  // checked, then read keeping the file's order (the grid's)
  return Json::parse(text);
}

Sweep read_sweep(const std::string& path) { return parse_sweep(read_sweep_file(path), path); }

WorkerReport run_workers(const Sweep& sweep, const WorkerOptions& w, std::ostream& progress) {
  check_worker(w);
  prepare_folder(sweep, w.out);
  WorkerOptions with = w;  // the file's measurements, then the caller's
  with.extras = chained({extras_of(sweep.measurements), w.extras});
  return run_runs(sweep.runs, with, progress);
}

namespace {

// A token of this pass of workers over the runs, which the results it writes carry: a failed run is
// tried once a pass.
std::string pass_token() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return fmt::format("{}-{}", ::getpid(), std::chrono::duration_cast<std::chrono::nanoseconds>(now).count());
}

// Threads and the memory check as they were before a sweep's workers ran.
struct Restore {
  std::size_t threads = get_num_threads();
  ~Restore() {
    set_num_threads(threads);
    training::share_memory(1);
  }
};

// A worker process's counts, sent to the parent through a pipe when it ends.
struct Counts {
  std::uint64_t ran = 0, failed = 0;
};

// Starts `jobs` worker processes on the slice and waits for them. A SIGINT or SIGTERM the parent
// gets is passed on to them once (they are a process group of their own, which a terminal's Ctrl-C
// does not reach), and each stops as a run stops; if the parent dies, they get SIGTERM.
WorkerReport run_processes(const std::vector<Run>& runs, const WorkerOptions& w, const std::string& pass,
                           std::ostream& progress) {
  progress << std::flush;
  std::fflush(nullptr);  // else a child would write again what the parent had not written yet
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error("sweep: cannot make a pipe for the worker processes");
  std::vector<pid_t> children;
  const auto stop_children = [&](int signal) {
    for (const pid_t pid : children) ::kill(pid, signal);
  };
  const pid_t parent = ::getpid();
  for (std::size_t j = 0; j < w.jobs; ++j) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      stop_children(SIGTERM);
      for (const pid_t child : children) ::waitpid(child, nullptr, 0);
      ::close(pipe_fds[0]);
      ::close(pipe_fds[1]);
      throw std::runtime_error("sweep: cannot start a worker process (fork)");
    }
    if (pid == 0) {  // a child: walks the same slice; the locks share the runs out
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(3);  // the parent died before the line above
      ::close(pipe_fds[0]);
      int status = 0;
      Counts counts;
      try {
        const WorkerReport r = walk(runs, w, pass, progress);
        counts = {r.ran, r.failed};
      } catch (const training::Interrupted&) {
        status = 3;
      } catch (const std::exception& e) {
        progress << fmt::format("sweep: worker {}: {}\n", j, e.what()) << std::flush;
        status = 2;
      }
      if (::write(pipe_fds[1], &counts, sizeof counts) != ssize_t(sizeof counts)) status = 2;
      ::_exit(status);  // its lines were written as they came
    }
    ::setpgid(pid, pid);  // also here, so that no signal slips in before the child's own call
    children.push_back(pid);
  }
  ::close(pipe_fds[1]);
  bool interrupted = false, broken = false;
  int forwarded = 0;
  for (const pid_t pid : children) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0) {
      if (errno != EINTR) break;
      if (const int signal = training::pending_stop(); signal && !forwarded) stop_children(forwarded = signal);
    }
    interrupted |= WIFEXITED(status) && WEXITSTATUS(status) == 3;
    broken |= !WIFEXITED(status) || WEXITSTATUS(status) == 2;
  }
  WorkerReport report;
  Counts counts;
  while (::read(pipe_fds[0], &counts, sizeof counts) == ssize_t(sizeof counts)) {
    report.ran += counts.ran;
    report.failed += counts.failed;
  }
  ::close(pipe_fds[0]);
  const int signal = forwarded ? forwarded : training::pending_stop();
  if (interrupted || signal)
    throw training::Interrupted(signal ? signal : SIGINT,
                                "sweep: interrupted; rerun it to go on (the runs that were in progress are trained again)");
  if (broken) throw std::runtime_error("sweep: a worker process failed; run the sweep again to go on");
  return report;
}

}  // namespace

WorkerReport run_runs(const std::vector<Run>& runs, const WorkerOptions& w, std::ostream& progress) {
  check_worker(w);
  const Restore restore;
  training::stop_on_signals();
  set_num_threads(1);  // runs outnumber cores: each single-threaded
  training::share_memory(w.jobs);
  const std::string pass = pass_token();
  std::size_t finished_before = 0;
  for (std::size_t i = w.index; i < runs.size(); i += w.of) {
    const std::optional<Json> r = result_of(w.out, runs[i]);
    finished_before += r && (*r)["status"] == "ok";
  }
  WorkerReport report;
  try {
    report = w.jobs == 1 ? walk(runs, w, pass, progress) : run_processes(runs, w, pass, progress);
  } catch (const training::Interrupted& stopped) {
    throw training::Interrupted(stopped.signal,
                                "sweep: interrupted; rerun it to go on (the runs that were in progress are trained again)");
  }
  report.finished = finished_before;
  // Runs of the slice with no result yet: held by workers of another machine all along.
  report.busy = 0;
  for (std::size_t i = w.index; i < runs.size(); i += w.of) report.busy += !result_of(w.out, runs[i]);
  if (w.stop_on_failure && report.failed) report.busy = 0;  // not run: this worker stopped
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

std::string summary_table(const Sweep& sweep, const Json& results) {
  // Configurations in the sweep's order: the task and the grid's values.
  std::vector<std::string> order;
  std::map<std::string, std::vector<const Json*>> groups;
  std::map<std::string, const Json*> labels;  // of each run, by id: as the file names it
  for (const Run& run : sweep.runs) labels[run.id] = &run.labels;
  const auto label = [&](const Json& r) {
    const auto it = labels.find(r.at("id").get<std::string>());
    if (it == labels.end()) throw std::invalid_argument(fmt::format("summary: {} is not a run of {}", r.at("id").dump(), sweep.file));
    std::vector<std::string> parts;
    for (const auto& [key, value] : it->second->items()) parts.push_back(plain_text(value));
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
    const auto [lo, hi] = report::wilson_interval(reached, accuracy.size());
    out += fmt::format("| {} | {} | {} | {} | {} |\n", l, groups[l].size(), failed,
                       s.n == 0 ? std::string("-") : fmt::format("{:.3f} ± {:.3f} (n = {})", s.mean, s.sd, s.n),
                       s.n == 0 ? std::string("-")
                                : fmt::format("{} of {} at {:.0f}% ({:.0f}–{:.0f}%)", reached, s.n, 100 * target,
                                              100 * lo, 100 * hi));
  }
  return out;
}

Collected collect(const Sweep& sweep, const std::string& out, bool partial) {
  std::error_code error;
  if (!fs::exists(out + "/sweep.json", error))
    throw std::runtime_error(fmt::format("{}: holds no sweep (no sweep.json): run the sweep there first", out));
  const FolderLock lock(out);  // one merge at a time
  Collected c;
  c.results = Json::array();
  for (const Run& run : sweep.runs) {
    std::optional<Json> r = result_of(out, run);
    if (!r) {
      c.missing.push_back(run.id);
      continue;
    }
    c.failed += (*r)["status"] != "ok";
    (*r)["labels"] = run.labels;  // as the file names it (results written before labels were kept)
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
