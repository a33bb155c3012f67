// qkv._qkv, the compiled half of `import qkv` (python/qkv/__init__.py): the library's calls on
// numpy arrays. Arrays qkv returns share the tensors' memory (read-only: a tensor's values do not
// change under it), and an array qkv returned comes back in as the same tensor, without a copy.
// Errors arrive as Python exceptions with the library's message: ValueError for bad arguments and
// options, OSError for run folders and files.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/complex.h>
#include <pybind11/stl.h>

#include <malloc.h>
#include <signal.h>

#include <atomic>
#include <complex>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <streambuf>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/core/autograd.hpp"
#include "qkv/core/ops.hpp"
#include "qkv/core/runtime.hpp"
#include "qkv/core/tensor.hpp"
#include "qkv/core/random.hpp"
#include "qkv/analysis/heads.hpp"
#include "qkv/analysis/patching.hpp"
#include "qkv/nn/detail/transformer_json.hpp"
#include "qkv/nn/circuits.hpp"
#include "qkv/nn/generate.hpp"
#include "qkv/report/ablate.hpp"
#include "qkv/report/alignment.hpp"
#include "qkv/report/inspect.hpp"
#include "qkv/report/across_training.hpp"
#include "qkv/report/fourier.hpp"
#include "qkv/report/logit_attribution.hpp"
#include "qkv/report/path_patching.hpp"
#include "qkv/report/patching.hpp"
#include "qkv/training/run_analysis.hpp"
#include "qkv/nn/seq2seq.hpp"
#include "qkv/nn/transformer.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/training/options.hpp"
#include "qkv/training/run_folder.hpp"
#include "qkv/training/run_options.hpp"
#include "qkv/training/trainer.hpp"
#include "qkv/sweep/sweep.hpp"
#include "qkv/version.hpp"

namespace py = pybind11;

namespace qkv::python {

namespace {

constexpr const char* tensor_capsule = "qkv.Tensor";

// The tensor a numpy array of ours shares, if `array` is one (its base is our capsule, and it
// views the whole tensor).
const Tensor* shared_tensor(const py::array& array) {
  PyObject* base = py::detail::array_proxy(array.ptr())->base;
  if (base == nullptr || !PyCapsule_IsValid(base, tensor_capsule)) return nullptr;
  const auto* t = static_cast<const Tensor*>(PyCapsule_GetPointer(base, tensor_capsule));
  const void* data = t->dtype() == DType::float32 ? static_cast<const void*>(t->value<float>().data())
                                                   : static_cast<const void*>(t->value<double>().data());
  if (array.data() != data || std::size_t(array.ndim()) != t->dim()) return nullptr;
  for (std::size_t d = 0; d < t->dim(); ++d)
    if (std::size_t(array.shape(py::ssize_t(d))) != t->shape()[d]) return nullptr;
  // Row-major, as the tensor is (a transposed view starts at the same address, with other strides).
  if (!(array.flags() & py::array::c_style)) return nullptr;
  return t;
}

template <class T>
py::array shared_array(const Tensor& t) {
  auto* held = new Tensor(t);  // the capsule's: it keeps the tensor's storage alive
  py::capsule owner = py::reinterpret_steal<py::capsule>(PyCapsule_New(held, tensor_capsule, [](PyObject* capsule) {
    delete static_cast<Tensor*>(PyCapsule_GetPointer(capsule, tensor_capsule));
  }));
  const Array<T>& a = held->value<T>();
  std::vector<py::ssize_t> shape(a.shape().begin(), a.shape().end()), strides(shape.size());
  py::ssize_t stride = sizeof(T);
  for (std::size_t d = shape.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= std::max<py::ssize_t>(shape[d], 1);
  }
  py::array out(py::dtype::of<T>(), shape, strides, a.data(), owner);
  py::detail::array_proxy(out.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return out;
}

}  // namespace

// A tensor's values as a numpy array that shares them.
py::array to_numpy(const Tensor& t) {
  return t.dtype() == DType::float32 ? shared_array<float>(t) : shared_array<double>(t);
}

// A float32 or float64 numpy array as a tensor: the tensor itself when the array is one qkv
// returned, else a copy (qkv's tensors own their memory). Other dtypes are a ValueError.
Tensor to_tensor(const py::array& array, const char* what) {
  if (const Tensor* t = shared_tensor(array)) return *t;
  const auto copy = [&](auto zero) {
    using T = decltype(zero);
    const auto values = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(array);
    Array<T> a = Array<T>::from_shape(Shape(values.shape(), values.shape() + values.ndim()));
    std::copy_n(values.data(), values.size(), a.data());
    return Tensor(std::move(a));
  };
  const py::dtype dtype = array.dtype();
  if (dtype.is(py::dtype::of<float>())) return copy(float{});
  if (dtype.is(py::dtype::of<double>())) return copy(double{});
  throw std::invalid_argument(fmt::format("{}: an array of float32 or float64, not {}", what, py::str(py::object(dtype)).cast<std::string>()));
}

// Integers (an array or a list) of 1 or 2 dimensions as int64 rows (B, T), a 1-d one as one row,
// with the dimensions they had; none for anything else.
std::optional<std::pair<IndexArray, std::size_t>> integer_rows(const py::handle& given) {
  const py::array array = py::array::ensure(given);
  if (!array || (array.dtype().kind() != 'i' && array.dtype().kind() != 'u') || (array.ndim() != 1 && array.ndim() != 2))
    return std::nullopt;
  const auto ids = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(array);
  const std::size_t B = ids.ndim() == 2 ? std::size_t(ids.shape(0)) : 1, T = std::size_t(ids.shape(ids.ndim() - 1));
  IndexArray out = IndexArray::from_shape({B, T});
  std::copy_n(ids.data(), ids.size(), out.data());
  return std::pair{std::move(out), std::size_t(ids.ndim())};
}

// Token ids, (T) or (B, T), as the model's (B, T) input; a ValueError for other shapes or dtypes.
IndexArray to_tokens(const py::handle& given) {
  auto rows = integer_rows(given);
  if (!rows) throw std::invalid_argument("tokens: an array (or list) of integer token ids, (T) or (B, T)");
  return std::move(rows->first);
}

// Booleans (B, S) or (T, T) as a mask; a ValueError naming `what` for anything else.
MaskArray bool_matrix(const py::handle& given, const char* what) {
  const auto values = py::array_t<bool, py::array::c_style | py::array::forcecast>::ensure(given);
  if (!values || values.ndim() != 2) throw std::invalid_argument(fmt::format("{}: a 2-d array of booleans", what));
  MaskArray out = MaskArray::from_shape({std::size_t(values.shape(0)), std::size_t(values.shape(1))});
  std::copy_n(values.data(), values.size(), out.data());
  return out;
}

// Python's sys.stderr as a C++ stream: a line at a time, under the GIL.
class PythonStderr : public std::streambuf {
 protected:
  int overflow(int c) override {
    if (c != EOF) {
      line_ += char(c);
      if (c == '\n' || c == '\r') sync();
    }
    return c;
  }
  int sync() override {
    if (line_.empty()) return 0;
    const py::gil_scoped_acquire gil;
    py::module_::import("sys").attr("stderr").attr("write")(line_);
    py::module_::import("sys").attr("stderr").attr("flush")();
    line_.clear();
    return 0;
  }

 private:
  std::string line_;
};

// JSON as Python values (dicts, lists, numbers, text, None).
py::object python_of(const nlohmann::json& j) { return py::module_::import("json").attr("loads")(j.dump()); }

// The options of a new run of `task`, checked by the option table: ValueError naming the option.
tasks::TrainOptions run_options(const std::string& task, const nlohmann::json& given) {
  try {
    return training::run_options(task, given);
  } catch (const training::RunOptionError& e) {
    throw std::invalid_argument(fmt::format("train: '{}' {}", e.option, e.what()));
  }
}

// Python values (str, int, float, bool) as JSON, for the option table.
nlohmann::json json_of(const py::handle& v, const std::string& name) {
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>();
  if (py::isinstance<py::int_>(v)) return v.cast<std::int64_t>();
  if (py::isinstance<py::float_>(v)) return v.cast<double>();
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  throw std::invalid_argument(fmt::format("{}: a number, text or True/False, not {}", name, std::string(py::str(v.get_type()))));
}

// A Python object, held from C++ (a registered task's spec lives as long as the process): released
// under the GIL, and not at all once the interpreter has ended.
std::shared_ptr<py::object> hold(py::object object) {
  return std::shared_ptr<py::object>(new py::object(std::move(object)), [](py::object* held) {
    if (Py_IsInitialized()) {
      const py::gil_scoped_acquire gil;
      delete held;
    } else {
      held->release();
      delete held;
    }
  });
}

// An attribute the task may have, or `otherwise`.
py::object attribute(const py::object& task, const char* name, py::object otherwise = py::none()) {
  return py::hasattr(task, name) ? task.attr(name) : otherwise;
}

// A task written in Python, by the protocol qkv.train documents: `vocab_size`, `readout` and
// `sample(batch, seed)` → {"tokens": (B, T), "targets": (B, T), -1 where nothing is scored}; and
// if it has them, `name`, `n_classes`, `max_len`, `causal`, `pad`, `description`, `token_name(id)`,
// `decode(tokens)`, `encode(text)`. Each batch is checked before training sees it.
class PythonTask : public tasks::Task {
 public:
  PythonTask(std::shared_ptr<py::object> task, std::string name) : task_(std::move(task)) {
    const py::gil_scoped_acquire gil;
    const py::object& t = *task_;
    info_.name = std::move(name);
    info_.description = attribute(t, "description", py::str("a task written in Python")).cast<std::string>();
    info_.vocab_size = count(t, "vocab_size", 1, tasks::max_width * 1000);
    const std::string readout = field(t, "readout").cast<std::string>();
    if (readout != "pointer" && readout != "token")
      fail("readout is '{}': \"pointer\" (a target is a position) or \"token\" (a target is a token id)", readout);
    info_.readout = readout == "pointer" ? nn::Readout::pointer : nn::Readout::token;
    info_.n_classes = info_.readout == nn::Readout::pointer ? 0
                      : py::hasattr(t, "n_classes")         ? count(t, "n_classes", 1, tasks::max_width * 1000)
                                                            : info_.vocab_size;
    info_.causal = attribute(t, "causal", py::bool_(true)).cast<bool>();
    if (const py::object pad = attribute(t, "pad"); !pad.is_none()) {
      info_.pad = pad.cast<std::int64_t>();
      if (*info_.pad < 0 || std::size_t(*info_.pad) >= info_.vocab_size)
        fail("pad is {}, not a token id 0-{}", *info_.pad, info_.vocab_size - 1);
    }
    if (py::hasattr(t, "max_len")) {
      info_.max_len = count(t, "max_len", 1, tasks::max_width);
    } else {  // the longest of a probe batch's rows: every batch is then checked against it
      info_.max_len = ids(call_sample(64, 0), "tokens", "sample(64, 0)").shape()[1];
    }
  }

  // The task of a registration, whose info the first one found.
  PythonTask(std::shared_ptr<py::object> task, tasks::TaskInfo info) : task_(std::move(task)), info_(std::move(info)) {}

  const tasks::TaskInfo& info() const override { return info_; }

  tasks::Batch sample(std::size_t batch_size, Generator& gen) const override {
    const std::uint64_t seed = gen.next_u64();
    const py::gil_scoped_acquire gil;
    const py::dict drawn = call_sample(batch_size, seed);
    const std::string call = fmt::format("sample({}, {})", batch_size, seed);
    tasks::Batch b{ids(drawn, "tokens", call), ids(drawn, "targets", call)};
    const std::size_t B = b.tokens.shape()[0], T = b.tokens.shape()[1];
    if (B != batch_size || T == 0 || T > info_.max_len)
      fail("{} returned tokens of shape ({}, {}); ({}, 1-{}) it must be", call, B, T, batch_size, info_.max_len);
    if (b.targets.shape() != b.tokens.shape())
      fail("{} returned targets of shape ({}, {}), and tokens of ({}, {})", call, b.targets.shape()[0],
           b.targets.shape()[1], B, T);
    for (std::size_t r = 0; r < B; ++r)
      for (std::size_t p = 0; p < T; ++p) {
        const std::int64_t token = b.tokens(r, p);
        if (token < 0 || std::size_t(token) >= info_.vocab_size)
          fail("{} returned token {} at row {}, position {}; token ids are 0-{}", call, token, r, p, info_.vocab_size - 1);
        std::int64_t& target = b.targets(r, p);
        if (target == -1 || target == tasks::ignore_target) {
          target = tasks::ignore_target;
          continue;
        }
        const bool pointer = info_.readout == nn::Readout::pointer;
        // A causal model's query attends to the positions up to its own.
        const std::size_t limit = pointer ? (info_.causal ? p + 1 : T) : info_.n_classes;
        if (target < 0 || std::size_t(target) >= limit)
          fail("{} returned target {} at row {}, position {}; {} 0-{}, or -1 where nothing is scored", call, target, r,
               p, pointer ? (info_.causal ? "a causal pointer target is a position up to its own," : "a pointer target is a position")
                          : "a target is a class",
               limit - 1);
        if (pointer && info_.pad && b.tokens(r, std::size_t(target)) == *info_.pad)
          fail("{} returned target {} at row {}, position {}, which holds the padding token {}: a target is a "
               "real token (bidirectional layers mask the padding)",
               call, target, r, p, *info_.pad);
      }
    return b;
  }

  std::string decode(const std::vector<std::int64_t>& tokens) const override {
    const py::gil_scoped_acquire gil;
    if (py::hasattr(*task_, "decode")) return task_->attr("decode")(tokens).cast<std::string>();
    std::vector<std::int64_t> kept;
    for (const std::int64_t t : tokens)
      if (t != info_.pad) kept.push_back(t);
    return tasks::numbers_text(kept);
  }

  std::vector<std::int64_t> encode(const std::string& text) const override {
    const py::gil_scoped_acquire gil;
    if (py::hasattr(*task_, "encode")) return task_->attr("encode")(text).cast<std::vector<std::int64_t>>();
    return tasks::parse_numbers(text, info_.vocab_size, info_.name);
  }

  std::string token_name(std::int64_t token) const override {
    const py::gil_scoped_acquire gil;
    if (py::hasattr(*task_, "token_name")) return task_->attr("token_name")(token).cast<std::string>();
    return std::to_string(token);
  }

 private:
  template <class... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> text, Args&&... args) const {
    throw std::invalid_argument(fmt::format("task '{}': {}", info_.name, fmt::format(text, std::forward<Args>(args)...)));
  }

  py::object field(const py::object& t, const char* name) const {
    if (!py::hasattr(t, name)) fail("has no `{}`; a task has vocab_size, readout and sample(batch, seed)", name);
    return t.attr(name);
  }

  // A whole number (a Python or numpy integer, not a bool) in [lo, hi].
  std::size_t count(const py::object& t, const char* name, std::size_t lo, std::size_t hi) const {
    const py::object v = field(t, name);
    const py::object whole = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
    if (!whole) PyErr_Clear();
    if (!whole || py::isinstance<py::bool_>(v) || whole < py::int_(lo) || whole > py::int_(hi))
      fail("{} is {}; a whole number {}-{}", name, std::string(py::repr(v)), lo, hi);
    return whole.cast<std::size_t>();
  }

  py::dict call_sample(std::size_t batch, std::uint64_t seed) const {
    const py::object drawn = field(*task_, "sample")(batch, seed);
    if (!py::isinstance<py::dict>(drawn) || !drawn.contains("tokens") || !drawn.contains("targets"))
      fail("sample({}, {}) returned {}; a dict of \"tokens\" and \"targets\", int64 (B, T)", batch, seed,
           std::string(py::str(drawn.get_type())));
    return drawn.cast<py::dict>();
  }

  IndexArray ids(const py::dict& drawn, const char* key, const std::string& call) const {
    auto rows = integer_rows(drawn[key]);
    if (!rows || rows->second != 2) fail("{} returned \"{}\" that are not a 2-d array of integers (B, T)", call, key);
    return std::move(rows->first);
  }

  std::shared_ptr<py::object> task_;
  tasks::TaskInfo info_;
};

// The names of the tasks written in Python registered in this process: their runs take Python, so
// a sweep of them runs in this process (jobs 1).
std::set<std::string>& python_task_names() {
  static std::set<std::string> names;
  return names;
}

// What a registration of a task written in Python read: the object and its facts. The same
// object with the same facts is not registered again (the registry keeps every registration).
struct Registered {
  PyObject* task;
  std::string facts;
};

// Registers a task written in Python under its `name` (or its class's), checked by building it
// once and drawing a batch; returns the name.
std::string register_python_task(const py::object& task) {
  const std::string name = attribute(task, "name", task.get_type().attr("__name__")).cast<std::string>();
  const std::shared_ptr<py::object> held = hold(task);
  const PythonTask first(held, name);  // its errors before the registry sees it, and a batch's
  Generator gen(0);
  {
    const py::gil_scoped_release free;  // as training calls it
    first.sample(2, gen);
  }
  const double target = attribute(task, "target", py::float_(0.99)).cast<double>();
  if (!(target > 0 && target <= 1)) throw std::invalid_argument(fmt::format("task '{}': target is {}; a share in (0, 1]", name, target));
  const tasks::TaskInfo& i = first.info();
  const std::string facts = fmt::format("{} {} {} {} {} {} {} {}", i.vocab_size, int(i.readout), i.n_classes, i.max_len,
                                        i.causal, i.pad.value_or(-1), target, i.description);
  static std::map<std::string, Registered> registered;
  if (const auto it = registered.find(name); it != registered.end() && it->second.task == task.ptr() && it->second.facts == facts)
    return name;
  tasks::register_task({.name = name,
                        .make = [held, info = first.info()](std::size_t) { return std::make_unique<PythonTask>(held, info); },
                        .target = target});
  registered[name] = {task.ptr(), facts};  // held by the registry: the address stays its
  python_task_names().insert(name);
  return name;
}

// What a call that trains holds while it runs (qkv.train, qkv.sweep): the process's one training
// slot (the stop flag, the signal handlers and the thread count are the process's: a second call,
// from this thread or another, is a RuntimeError), the thread count it asks for, and qkv's handlers of SIGINT
// and SIGTERM in place of Python's, so that they stop a run as they stop `qkv train` (a checkpoint
// of the step, then training::Interrupted, which arrives as KeyboardInterrupt). Progress goes to
// sys.stderr, or for a sweep's worker processes to the process's stderr (a forked child must not
// call Python). A signal that came too late to stop anything (in a run's last step) is raised
// again once Python's handlers are back, as if it came then.
class Running {
 public:
  Running(std::size_t threads, bool to_python) : threads_(get_num_threads()) {
    if (busy().exchange(true)) {  // in this thread (a task's sample() that trains) or another
      PyErr_SetString(PyExc_RuntimeError, "qkv: another qkv.train or qkv.sweep is running in this process");
      throw py::error_already_set();
    }
    if (to_python) progress_.rdbuf(&python_);
    set_num_threads(threads);
    for (int i = 0; i < 2; ++i) sigaction(signals[i], nullptr, &saved_[i]);
    training::stop_on_signals();
  }
  ~Running() {
    progress_.flush();
    for (int i = 0; i < 2; ++i) sigaction(signals[i], &saved_[i], nullptr);
    set_num_threads(threads_);
    busy() = false;
    if (const int signal = training::take_pending_stop()) ::raise(signal);
  }
  Running(const Running&) = delete;
  Running& operator=(const Running&) = delete;

  // f(progress), with the GIL released. A stop that ended it (Interrupted, which arrives as
  // KeyboardInterrupt) has been answered: it is not raised again.
  template <class F>
  auto operator()(F&& f) {
    const py::gil_scoped_release free;
    try {
      return f(progress_);
    } catch (const training::Interrupted&) {
      training::take_pending_stop();
      throw;
    }
  }

 private:
  static std::atomic<bool>& busy() {
    static std::atomic<bool> b{false};
    return b;
  }
  static constexpr int signals[2] = {SIGINT, SIGTERM};
  std::size_t threads_;
  struct sigaction saved_[2] {};
  PythonStderr python_;
  std::ostream progress_{std::cerr.rdbuf()};
};

// qkv.train(task, out=None, force=False, resume=False, threads=1, **options): `qkv train TASK` with
// options named as its long options (underscores for dashes), for a built-in task by name or a task
// written in Python (registered under its name); its final JSON object as a dict.
py::object train(const py::object& task, const py::object& out, bool force, bool resume, const py::object& threads,
                 const py::kwargs& options) {
  const std::string name = py::isinstance<py::str>(task) ? task.cast<std::string>() : register_python_task(task);
  nlohmann::json given = nlohmann::json::object();
  for (const auto& [key, value] : options) given[key.cast<std::string>()] = json_of(value, key.cast<std::string>());
  tasks::task_spec(name);  // an unknown task, named as such
  const std::string dir = out.is_none() ? "runs/" + name : out.cast<std::string>();
  tasks::TrainOptions o;
  if (resume) {
    for (const auto& [key, value] : given.items())
      if (key != "steps")
        throw std::invalid_argument(fmt::format("train: resume=True takes the run's options from its config.json (but "
                                                "steps, which extends it): drop {}",
                                                key));
    if (force) throw std::invalid_argument("train: resume=True continues the run; force=True would replace it");
    std::optional<std::size_t> steps;
    if (given.contains("steps")) steps = run_options(name, given).steps;
    o = training::resumed_options(dir, name, steps);
  } else {
    o = run_options(name, given);
    o.out = dir;
    o.force = force;
  }
  // As the run started (a resume), unless asked otherwise; a new run: one thread, as the program's.
  Running running(threads.is_none() ? (resume ? o.threads : 1) : threads.cast<std::size_t>(), true);
  try {
    const training::TrainResult r = running([&](std::ostream& progress) { return training::train(o, progress, false); });
    return python_of(training::result_json(o, r));
  } catch (const training::OptionError& e) {
    const std::string option = training::option_of_field(e.field);
    throw std::invalid_argument(fmt::format("train: '{}' {}", option.empty() ? e.field : option, e.what()));
  }
}


// A results table as a pandas DataFrame when pandas is there, else a list of dicts (a row each).
py::object table_object(const sweep::ResultsTable& table) {
  py::list rows;
  for (const auto& row : table.rows) {
    py::dict r;
    for (std::size_t c = 0; c < table.columns.size(); ++c) r[py::str(table.columns[c])] = python_of(row[c]);
    rows.append(r);
  }
  try {
    return py::module_::import("pandas").attr("DataFrame")(rows, py::arg("columns") = table.columns);
  } catch (const py::error_already_set& e) {
    if (!e.matches(PyExc_ImportError)) throw;
    return rows;
  }
}

// A sweep given as a file's path or as a dict in the file's form, read and planned.
sweep::Sweep sweep_of(const py::object& spec) {
  if (py::isinstance<py::str>(spec)) return sweep::read_sweep(spec.cast<std::string>());
  const std::string text = py::module_::import("json").attr("dumps")(spec).cast<std::string>();
  return sweep::parse_sweep(nlohmann::ordered_json::parse(text), "sweep");
}

// The results of the sweep in `out` (its sweep.json's runs), merged as `qkv sweep --collect` merges them.
py::object collected(const sweep::Sweep& plan, const std::string& out, bool partial) {
  const sweep::Collected c = sweep::collect(plan, out, partial);
  return table_object(sweep::results_table(plan, c.results));
}

// qkv.sweep(spec, out, jobs=1, index=0, of=1): `qkv sweep`, then its results as a table.
py::object run_sweep(const py::object& spec, const std::string& out, std::size_t jobs, std::size_t index, std::size_t of) {
  const sweep::Sweep plan = sweep_of(spec);
  for (const sweep::Run& run : plan.runs)
    if (jobs > 1 && python_task_names().count(run.task))
      throw std::invalid_argument(fmt::format("sweep: the {} task is written in Python: its runs take this process "
                                              "(jobs=1)",
                                              run.task));
  sweep::WorkerReport report;
  {
    Running running(get_num_threads(), jobs == 1);
    report = running([&](std::ostream& progress) {
      return sweep::run_workers(plan, {.out = out, .jobs = jobs, .index = index, .of = of}, progress);
    });
  }
  if (report.failed)
    PyErr_WarnEx(PyExc_RuntimeWarning,
                 fmt::format("sweep: {} runs failed; their errors are in the results' \"error\"", report.failed).c_str(), 1);
  return collected(plan, out, of > 1);
}

// names_filter as run_with_cache takes it: None (every point), a name, a list of names, or a
// predicate on the name.
nn::HookFilter filter_of(const py::object& names) {
  if (names.is_none()) return {};
  if (py::isinstance<py::str>(names)) return std::vector<std::string>{names.cast<std::string>()};
  if (PyCallable_Check(names.ptr()))
    return nn::HookFilter([names](const std::string& name) { return names(name).cast<bool>(); });
  return names.cast<std::vector<std::string>>();
}

struct Hook {
  std::string name;
};

// One of the per-head matrices of every layer, stacked as TransformerLens stacks them: (layers,
// heads, rows, cols), from `matrix(attention, head)` (a copy: the model keeps them otherwise).
template <class Matrix>
py::array stacked(const nn::Transformer& model, Matrix matrix) {
  const std::size_t L = model.blocks.size(), H = model.config().heads;
  std::vector<Tensor> parts;
  for (std::size_t l = 0; l < L; ++l)
    for (std::size_t h = 0; h < H; ++h) parts.push_back(matrix(model.blocks[l]->attn, h).to(DType::float64));
  const Shape one = parts.front().shape();
  Array<double> out = Array<double>::from_shape({L, H, one[0], one[1]});
  for (std::size_t i = 0; i < parts.size(); ++i)
    std::copy_n(parts[i].value<double>().data(), one[0] * one[1], out.data() + i * one[0] * one[1]);
  return to_numpy(Tensor(std::move(out)).to(model.tok.weight.dtype()));
}

// Token ids (B, T) as a numpy int64 array of their own.
py::array_t<std::int64_t> ids_array(const IndexArray& ids) {
  py::array_t<std::int64_t> out(std::vector<py::ssize_t>(ids.shape().begin(), ids.shape().end()));
  std::copy_n(ids.data(), ids.size(), out.mutable_data());
  return out;
}

// A float64 matrix as a numpy array of its own.
py::array matrix_array(Array<double> a) { return to_numpy(Tensor(std::move(a))); }

// The head `h` of layer `l`, checked: IndexError naming the model's layers or heads.
const nn::MultiHeadAttention& attention_of(const nn::Transformer& model, std::size_t l, std::size_t h) {
  if (l >= model.blocks.size())
    throw py::index_error(fmt::format("layer {}: the model has {} layers", l, model.blocks.size()));
  if (h >= model.config().heads) throw py::index_error(fmt::format("head {}: the model has {} heads a layer", h, model.config().heads));
  return model.blocks[l]->attn;
}

// A run's inspection, as `qkv inspect DIR` reads it: the input given as token ids, or the task's
// typical input.
training::RunInspection inspection_of(const std::string& dir, const py::object& input, bool history,
                                       bool along_training = false) {
  std::optional<std::vector<std::int64_t>> ids;
  if (!input.is_none()) {
    const IndexArray tokens = to_tokens(input);
    if (tokens.shape()[0] != 1) throw std::invalid_argument("input: one sequence of token ids");
    ids = std::vector<std::int64_t>(tokens.begin(), tokens.end());
  }
  return training::inspect_run(dir, ids, history, along_training);
}


// The activations a run_with_cache kept, by hook name.
py::dict cache_dict(const nn::Activations& cache) {
  py::dict activations;
  for (const auto& [name, value] : cache.activations) activations[py::str(name)] = to_numpy(value);
  return activations;
}

// fwd_hooks as run_with_hooks takes them: (name, fn) pairs, fn(activation, hook) returning None or
// an array to go on with.
nn::NamedHooks named_hooks(const std::vector<std::pair<std::string, py::function>>& fwd_hooks) {
  nn::NamedHooks hooks;
  for (const auto& [name, fn] : fwd_hooks)
    hooks.emplace_back(name, [fn](const Tensor& value, const std::string& point) {
      const py::object replaced = fn(to_numpy(value), Hook{point});
      return replaced.is_none() ? value : to_tensor(py::array::ensure(replaced), point.c_str());
    });
  return hooks;
}

// A config dict over the defaults `defaults` (config.json's "model" with every field), read by
// `read` as the library reads the file's; ValueError naming the field.
template <class Read>
auto config_over(nlohmann::json defaults, const py::dict& config, Read read) {
  const nlohmann::json given = nlohmann::json::parse(py::module_::import("json").attr("dumps")(config).cast<std::string>());
  for (const auto& [key, value] : given.items()) defaults[key] = value;
  try {
    return read(defaults);
  } catch (const std::runtime_error& e) {
    throw std::invalid_argument(e.what());
  }
}

// A source padding mask as the encoder takes it: None, or booleans (B, S), False at padding.
MaskArray padding_of(const py::object& mask) {
  return mask.is_none() ? MaskArray() : bool_matrix(mask, "source_padding: (B, S), False at padding");
}

// What both models' classes have from Module: parameters and hook points by name.
template <class Class>
void add_module_calls(Class& cls) {
  using Model = typename Class::type;
  cls.def("hook_names", &Model::hook_names, "Every hook point's name")
      .def(
          "state_dict",
          [](const Model& model) {
            py::dict out;
            for (const auto& [name, p] : model.state_dict()) out[py::str(name)] = to_numpy(p);
            return out;
          },
          "Every parameter by name, trainable or frozen, as arrays that share the model's memory")
      .def(
          "load_state_dict",
          [](Model& model, const py::dict& state) {
            StateDict values;
            for (const auto& [name, value] : state)
              values.emplace_back(py::str(name), to_tensor(py::array::ensure(value), "load_state_dict"));
            model.load_state_dict(values);
          },
          py::arg("state"), "Copies the arrays into the parameters of the same names (ValueError listing any missing, "
          "unexpected or mis-shaped name; then nothing has changed)");
}

// The scores (heads, N, N) of a layer's heads when the stream holds only the rows of `table`.
py::array table_array(const nn::Transformer& model, std::size_t layer, const Tensor& table) {
  attention_of(model, layer, 0);
  const NoGradGuard no_grad;
  const Tensor t = nn::table_scores(*model.blocks[layer], table);
  return to_numpy(reshape(t, {std::int64_t(t.size(1)), std::int64_t(t.size(2)), std::int64_t(t.size(3))}));
}

// A run folder's model: a Transformer, or an EncoderDecoder for a seq2seq task's run.
py::object load_run(const std::string& dir) {
  if (training::read_config(dir).encoder_layers > 0)
    return py::cast(std::shared_ptr<nn::EncoderDecoder>(training::load_encoder_decoder(dir)));
  return py::cast(std::shared_ptr<nn::Transformer>(training::load_model(dir)));
}

}  // namespace qkv::python

PYBIND11_MODULE(_qkv, m) {
  using namespace qkv;
  using namespace qkv::python;
  m.doc() = "qkv: train small attention models and look inside them";
  // A training step frees and allocates its activations again each step. In a Python process
  // glibc gives the heap's freed top back to the system at once and faults it in again the next
  // step (4.6x slower steps than the qkv program's on brackets); 64 MB of padding at the top of
  // the heap keeps it, as the program's heap does.
  mallopt(M_TOP_PAD, 64 << 20);
  m.attr("__version__") = QKV_VERSION;

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const py::builtin_exception& e) {  // IndexError and the like, as pybind11 raises them
      e.set_error();
    } catch (const training::UsageError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const std::invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const training::Interrupted& e) {
      PyErr_SetString(PyExc_KeyboardInterrupt, e.what());
    } catch (const std::runtime_error& e) {  // qkv's file and run-folder errors, each naming its file
      PyErr_SetString(PyExc_OSError, e.what());
    }
  });

  py::class_<Hook>(m, "Hook", "A hook point, as a hook function sees it").def_readonly("name", &Hook::name);

  py::class_<nn::Transformer, std::shared_ptr<nn::Transformer>> transformer(m, "Transformer", "A decoder-only model");
  add_module_calls(transformer);
  transformer
      .def(
          "__call__",
          [](const nn::Transformer& model, const py::handle& tokens) {
            const NoGradGuard no_grad;
            return to_numpy(model.forward(to_tokens(tokens)).logits);
          },
          py::arg("tokens"), "Logits (B, T, classes), or for the pointer readout head 0's scores (B, T, T)")
      .def(
          "run_with_cache",
          [](nn::Transformer& model, const py::handle& tokens, const py::object& names_filter, bool incl_bwd,
             const py::object& targets) {
            const IndexArray ids = to_tokens(tokens);
            if (!incl_bwd) {
              if (!targets.is_none()) throw std::invalid_argument("run_with_cache: targets are for incl_bwd=True");
              const NoGradGuard no_grad;
              const nn::ActivationCache cache = model.run_with_cache(ids, filter_of(names_filter));
              return py::make_tuple(to_numpy(cache.output.logits), cache_dict(cache));
            }
            // The gradient of the loss on `targets` at each point kept, as NAME_grad (TransformerLens's
            // incl_bwd=True, whose backward is of the loss).
            if (targets.is_none())
              throw std::invalid_argument("run_with_cache: incl_bwd=True needs targets, (B, T) token ids or -100, whose loss "
                                          "the gradients are of");
            IndexArray wanted;
            try {
              wanted = to_tokens(targets);
            } catch (const std::invalid_argument&) {
              throw std::invalid_argument("run_with_cache: targets: an array (or list) of integer token ids or -100, (B, T)");
            }
            if (wanted.shape() != ids.shape())
              throw std::invalid_argument(fmt::format("run_with_cache: targets {} for tokens {}", to_string(Shape(wanted.shape().begin(), wanted.shape().end())),
                                                      to_string(Shape(ids.shape().begin(), ids.shape().end()))));
            const nn::HookFilter filter = filter_of(names_filter);
            std::vector<std::string> points;
            for (const std::string& name : model.hook_names())
              if (filter.keeps(name)) points.push_back(name);
            const analysis::ActivationGradients g = analysis::run_with_gradients(
                model, ids, points, [&](const nn::TransformerOutput& out) { return model.loss(out, wanted); });
            py::dict cache = cache_dict(g.activations);
            for (const auto& [name, gradient] : g.gradients.activations) cache[py::str(name + "_grad")] = to_numpy(gradient);
            return py::make_tuple(to_numpy(g.output.logits.detach()), cache);
          },
          py::arg("tokens"), py::arg("names_filter") = py::none(), py::arg("incl_bwd") = false, py::arg("targets") = py::none(),
          "(logits, cache): the activation at every hook point names_filter keeps (None: all; a name, a list of "
          "names, or a predicate), by its TransformerLens name; with incl_bwd=True and targets (B, T), also the "
          "gradient of the loss on the targets at each, as NAME_grad (the parameters get none)")
      .def(
          "run_with_hooks",
          [](nn::Transformer& model, const py::handle& tokens, const std::vector<std::pair<std::string, py::function>>& fwd_hooks) {
            const NoGradGuard no_grad;
            return to_numpy(model.run_with_hooks(to_tokens(tokens), named_hooks(fwd_hooks)).logits);
          },
          py::arg("tokens"), py::arg("fwd_hooks"),
          "Logits with hooks: each (name, fn) calls fn(activation, hook) at the point, which returns None (go on with "
          "it) or an array of the same shape to go on with instead")
      .def(py::init([](const py::dict& config, std::uint64_t seed) {
             Generator gen(seed);
             const auto read = [](const nlohmann::json& j) { return nn::detail::read_transformer_config(j, "config", ""); };
             return std::make_shared<nn::Transformer>(
                 config_over(nn::detail::transformer_config_json(nn::TransformerConfig{}), config, read), gen);
           }),
           py::arg("config"), py::arg("seed") = 0,
           "A new model from a config (as config.json's \"model\" holds it; unset fields at their defaults), its "
           "parameters drawn from `seed` as qkv train draws them")
      .def(
          "generate",
          [](const nn::Transformer& model, const py::handle& tokens, std::size_t count, double temperature, std::size_t top_k,
             std::uint64_t seed, bool use_cache) {
            Generator gen(seed);
            const IndexArray prompt = to_tokens(tokens);
            const NoGradGuard no_grad;
            return ids_array(nn::generate(model, prompt, count, {.temperature = temperature, .top_k = top_k}, gen, use_cache));
          },
          py::arg("tokens"), py::arg("count"), py::arg("temperature") = 0.0, py::arg("top_k") = 0, py::arg("seed") = 0,
          py::arg("use_cache") = true,
          "The prompt (B, T0) and `count` tokens after it: greedy, or drawn at `temperature` among the `top_k` most "
          "likely, from `seed`")
      .def_property_readonly("W_Q", [](const nn::Transformer& m) { return stacked(m, [](const nn::MultiHeadAttention& a, std::size_t h) { return a.W_q(h); }); },
                             "(layers, heads, d_model, d_head)")
      .def_property_readonly("W_K", [](const nn::Transformer& m) { return stacked(m, [](const nn::MultiHeadAttention& a, std::size_t h) { return a.W_k(h); }); },
                             "(layers, heads, d_model, d_head): a query head's keys (GQA/MQA: its kv head's)")
      .def_property_readonly("W_V", [](const nn::Transformer& m) { return stacked(m, [](const nn::MultiHeadAttention& a, std::size_t h) { return a.W_v(h); }); },
                             "(layers, heads, d_model, d_v)")
      .def_property_readonly("W_O", [](const nn::Transformer& m) { return stacked(m, [](const nn::MultiHeadAttention& a, std::size_t h) { return a.W_o(h); }); },
                             "(layers, heads, d_v, d_model)")
      .def_property_readonly(
          "cfg", [](const nn::Transformer& model) {
            return python_of(nn::detail::transformer_config_json(model.config()));
          },
          "The model's config, as config.json's \"model\" holds it");

  py::class_<nn::EncoderDecoder, std::shared_ptr<nn::EncoderDecoder>> encoder_decoder(
      m, "EncoderDecoder", "An encoder-decoder: the model of a seq2seq task's run");
  add_module_calls(encoder_decoder);
  encoder_decoder
      .def(py::init([](const py::dict& config, std::uint64_t seed) {
             Generator gen(seed);
             const auto read = [](const nlohmann::json& j) { return nn::detail::read_encoder_decoder_config(j, "config", ""); };
             nn::EncoderDecoderConfig defaults{.src_vocab = 1, .tgt_vocab = 1, .max_src_len = 1, .max_tgt_len = 1};
             return std::make_shared<nn::EncoderDecoder>(
                 config_over(nn::detail::encoder_decoder_config_json(defaults), config, read), gen);
           }),
           py::arg("config"), py::arg("seed") = 0,
           "A new model from a config (as a seq2seq run's config.json \"model\" holds it: src_vocab, tgt_vocab, "
           "max_src_len, max_tgt_len and the rest at their defaults), its parameters drawn from `seed`")
      .def(
          "__call__",
          [](const nn::EncoderDecoder& model, const py::handle& source, const py::handle& tokens, const py::object& padding) {
            const NoGradGuard no_grad;
            return to_numpy(model.forward(to_tokens(source), to_tokens(tokens), false, padding_of(padding)).logits);
          },
          py::arg("source"), py::arg("tokens"), py::arg("source_padding") = py::none(),
          "Logits (B, T, tgt_vocab) of the decoder's input `tokens` (B, T) for `source` (B, S); source_padding: "
          "booleans (B, S), False where the source is padding, which no query attends")
      .def(
          "encode",
          [](const nn::EncoderDecoder& model, const py::handle& source, const py::object& padding) {
            const NoGradGuard no_grad;
            return to_numpy(model.encode(to_tokens(source), padding_of(padding)));
          },
          py::arg("source"), py::arg("source_padding") = py::none(), "The memory: the encoder's output (B, S, d_model)")
      .def(
          "run_with_cache",
          [](nn::EncoderDecoder& model, const py::handle& source, const py::handle& tokens, const py::object& names_filter,
             const py::object& padding) {
            const NoGradGuard no_grad;
            const nn::EncoderDecoderCache cache =
                model.run_with_cache(to_tokens(source), to_tokens(tokens), filter_of(names_filter), padding_of(padding));
            return py::make_tuple(to_numpy(cache.output.logits), cache_dict(cache));
          },
          py::arg("source"), py::arg("tokens"), py::arg("names_filter") = py::none(), py::arg("source_padding") = py::none(),
          "(logits, cache), the cache by hook name (encoder.blocks.0.attn.hook_pattern, "
          "decoder.blocks.0.cross_attn.hook_pattern, …)")
      .def(
          "run_with_hooks",
          [](nn::EncoderDecoder& model, const py::handle& source, const py::handle& tokens,
             const std::vector<std::pair<std::string, py::function>>& fwd_hooks, const py::object& padding) {
            const NoGradGuard no_grad;
            return to_numpy(
                model.run_with_hooks(to_tokens(source), to_tokens(tokens), named_hooks(fwd_hooks), false, padding_of(padding)).logits);
          },
          py::arg("source"), py::arg("tokens"), py::arg("fwd_hooks"), py::arg("source_padding") = py::none(),
          "Logits with hooks, as Transformer.run_with_hooks")
      .def(
          "generate",
          [](const nn::EncoderDecoder& model, const py::handle& source, std::size_t count, std::int64_t start,
             double temperature, std::size_t top_k, std::uint64_t seed, bool use_cache, const py::object& padding) {
            Generator gen(seed);
            const IndexArray src = to_tokens(source);
            const NoGradGuard no_grad;
            return ids_array(nn::generate(model, src, start, count, {.temperature = temperature, .top_k = top_k}, gen,
                                          use_cache, padding_of(padding)));
          },
          py::arg("source"), py::arg("count"), py::arg("start"), py::arg("temperature") = 0.0, py::arg("top_k") = 0,
          py::arg("seed") = 0, py::arg("use_cache") = true, py::arg("source_padding") = py::none(),
          "The decoder's `count` tokens (B, count) after the `start` token (the task's `start`) for `source` (B, S): "
          "greedy, or drawn at `temperature` among the `top_k` most likely, from `seed`")
      .def_property_readonly(
          "cfg", [](const nn::EncoderDecoder& model) { return python_of(nn::detail::encoder_decoder_config_json(model.config())); },
          "The model's config, as a seq2seq run's config.json \"model\" holds it");

  py::class_<tasks::Task, std::shared_ptr<tasks::Task>>(m, "Task", "A built-in task: its sequences and what they ask")
      .def_property_readonly("name", [](const tasks::Task& t) { return t.info().name; })
      .def_property_readonly("description", [](const tasks::Task& t) { return t.info().description; })
      .def_property_readonly("vocab_size", [](const tasks::Task& t) { return t.info().vocab_size; })
      .def_property_readonly("n_classes", [](const tasks::Task& t) { return t.info().n_classes; },
                             "Classes of token targets (the pointer readout's targets are positions: 0)")
      .def_property_readonly("max_len", [](const tasks::Task& t) { return t.info().max_len; })
      .def_property_readonly("readout", [](const tasks::Task& t) { return std::string(nn::name_of(t.info().readout)); },
                             "\"pointer\": a target is a position; \"token\": a target is a class")
      .def_property_readonly("causal", [](const tasks::Task& t) { return t.info().causal; })
      .def_property_readonly(
          "seq2seq",
          [](const tasks::Task& t) -> py::object {
            if (!t.info().seq2seq) return py::none();
            const tasks::Seq2SeqInfo& s = *t.info().seq2seq;
            py::dict sides;
            sides["source_vocab"] = s.source_vocab;
            sides["max_source_len"] = s.max_source_len;
            sides["source_pad"] = s.source_pad;
            sides["start"] = s.start;
            sides["end"] = s.end;
            return sides;
          },
          "A seq2seq task's sides (source_vocab, max_source_len, source_pad, start, end), or None")
      .def_property_readonly(
          "split",
          [](const tasks::Task& t) -> py::object {
            const tasks::Split* split = t.split();
            if (!split) return py::none();
            py::dict sides;
            for (const auto& [name, rows] : {std::pair{"train", &split->train}, {"test", &split->test}}) {
              py::dict side;
              side["tokens"] = ids_array(rows->tokens);
              side["targets"] = ids_array(rows->targets);
              sides[name] = side;
            }
            return sides;
          },
          "A data set's (modadd's) split: {train, test}, each {tokens (N, T), targets (N, T), -100 where nothing is "
          "scored}; None for a task that draws its sequences")
      .def(
          "sample",
          [](const tasks::Task& t, std::size_t batch, std::uint64_t seed) {
            Generator gen(seed);
            const tasks::Batch b = t.sample(batch, gen);
            py::dict out;
            out["tokens"] = ids_array(b.tokens);
            out["targets"] = ids_array(b.targets);
            if (b.source.dimension() > 0) out["source"] = ids_array(b.source);
            return out;
          },
          py::arg("batch"), py::arg("seed"),
          "A batch, drawn from `seed` as training draws its own: {tokens (B, T), targets (B, T), -100 where nothing "
          "is scored; a seq2seq task's source (B, S)}, int64")
      .def("decode", [](const tasks::Task& t, const std::vector<std::int64_t>& tokens) { return t.decode(tokens); },
           py::arg("tokens"), "A row of tokens as the task's text")
      .def("encode", [](const tasks::Task& t, const std::string& text) { return t.encode(text); }, py::arg("text"),
           "The task's text as tokens")
      .def("token_name", [](const tasks::Task& t, std::int64_t token) { return t.token_name(token); }, py::arg("token"));
  m.def(
      "task",
      [](const std::string& name, std::size_t n, std::uint64_t seed, std::optional<double> train_fraction) {
        tasks::TrainOptions o = tasks::default_options(name, n);
        o.seed = seed;
        if (train_fraction) {
          if (!tasks::task_spec(name).make_dataset)
            throw py::value_error(fmt::format("task: train_fraction is for a data set's split; the {} task draws its sequences", name));
          o.train_fraction = *train_fraction;
        }
        return std::shared_ptr<tasks::Task>(tasks::make_task(o));
      },
      py::arg("name"), py::arg("n") = 0, py::arg("seed") = 0, py::arg("train_fraction") = py::none(),
      "A built-in task, as the program makes it (n: its size, for line, cycle and modadd's p; 0: the default); a data "
      "set's (modadd's) split is the one a run of this seed and train_fraction (none: the task's default) trains on");
  m.def(
      "inspect",
      [](const std::string& dir, const py::object& input, bool history) {
        const training::RunInspection r = inspection_of(dir, input, history);
        return python_of(std::visit([](const auto& i) { return report::to_json(i); }, r));
      },
      py::arg("dir"), py::arg("input") = py::none(), py::arg("history") = false,
      "What `qkv inspect DIR --json` prints, as a dict: every head's circuits, σ, spectrum and token table, the "
      "input's attention and scores, the composition of the heads (input: token ids; none: the task's typical one)");
  m.def(
      "report_html",
      [](const std::string& dir, const py::object& input) {
        const training::RunInspection r = inspection_of(dir, input, true, true);
        if (const auto* i = std::get_if<analysis::Inspection>(&r)) return report::to_html(*i);
        throw std::invalid_argument(fmt::format("report_html: {} is a seq2seq run; its report is qkv.inspect's", dir));
      },
      py::arg("dir"), py::arg("input") = py::none(),
      "The self-contained HTML page of `qkv inspect DIR --html` (display it with IPython.display.HTML)");
  m.def(
      "evaluate",
      [](const std::string& dir, std::size_t n, std::uint64_t seed, const py::object& data) {
        return python_of(data.is_none() ? training::evaluate_run(dir, n, seed) : training::evaluate_run(dir, data.cast<std::string>()));
      },
      py::arg("dir"), py::arg("n") = 1024, py::arg("seed") = 1, py::arg("data") = py::none(),
      "`qkv eval DIR`: accuracy and exact match on n fresh sequences from seed, or on a data file's");
  m.def(
      "ablate",
      [](const std::string& dir, std::size_t n, std::uint64_t seed, const py::object& data) {
        return python_of(report::to_json(data.is_none() ? training::ablate_run(dir, n, seed)
                                                        : training::ablate_run(dir, data.cast<std::string>())));
      },
      py::arg("dir"), py::arg("n") = 1024, py::arg("seed") = 1, py::arg("data") = py::none(),
      "`qkv ablate DIR --json`: every head zero- and mean-ablated (and patched, where the task corrupts) in turn");
  m.def(
      "patch",
      [](const std::string& dir, const std::string& component, bool by_position, bool noising, bool attribution,
         std::size_t n, std::uint64_t seed) {
        return python_of(report::to_json(training::patch_run(dir, attribution, {.component = analysis::patch_component(component),
                                                                   .by_position = by_position,
                                                                   .noising = noising,
                                                                   .sequences = n,
                                                                   .seed = seed})));
      },
      py::arg("dir"), py::arg("component"), py::arg("by_position") = false, py::arg("noising") = false,
      py::arg("attribution") = false, py::arg("n") = 256, py::arg("seed") = 1,
      "`qkv patch DIR --component C --json`: activation patching of one component (resid_pre, attn_out, resid_mid, "
      "mlp_out, resid_post, q, k, v, pattern, z) at every layer and head, all positions at once or each apart, "
      "denoising (the corrupted run with clean activations) or noising; attribution: each patch's loss estimated to first "
      "order from the gradients (attribution patching)");
  m.def(
      "path_patch",
      [](const std::string& dir, bool noising, std::size_t n, std::uint64_t seed) {
        return python_of(report::to_json(training::path_patch_run(dir, {.noising = noising, .sequences = n, .seed = seed})));
      },
      py::arg("dir"), py::arg("noising") = false, py::arg("n") = 256, py::arg("seed") = 1,
      "`qkv patch DIR --path --json`: path patching, each head's output reaching only the logits or one later head's "
      "q, k or v, every other later head held");
  m.def(
      "across_training",
      [](const std::string& dir, std::size_t n, std::uint64_t seed) {
        return python_of(report::to_json(training::across_training_run(dir, {.sequences = n, .seed = seed})));
      },
      py::arg("dir"), py::arg("n") = 64, py::arg("seed") = 1,
      "`qkv inspect DIR --across-training --json`: every checkpoint the run kept (train(keep_checkpoints=\"log\")) "
      "measured: held-out loss, in-context score, each head's σ, detectors, prefix matching, patching and direct logit "
      "attribution, composition, and the step where each formed");
  m.def(
      "fourier",
      [](const std::string& dir) { return python_of(report::to_json(training::fourier_run(dir))); },
      py::arg("dir"),
      "`qkv inspect DIR --fourier --json`: a modadd run in the Fourier basis of Z_p (key frequencies, embedding and "
      "unembedding norms per frequency, neurons, heads, restricted and excluded losses, weight norm), for its final "
      "model and every checkpoint it kept");
  m.def(
      "logit_attribution",
      [](const std::string& dir, std::size_t n, std::uint64_t seed) {
        return python_of(report::to_json(training::logit_attribution_run(dir, {.sequences = n, .seed = seed}), dir));
      },
      py::arg("dir"), py::arg("n") = 256, py::arg("seed") = 1,
      "`qkv attribute DIR --json`: direct logit attribution, each head's, MLP's and embedding's part of the logit "
      "difference through the readout alone");
  m.def(
      "qk_circuit",
      [](const nn::Transformer& model, std::size_t layer, std::size_t head) {
        return matrix_array(nn::qk_circuit(attention_of(model, layer, head), head));
      },
      py::arg("model"), py::arg("layer"), py::arg("head"), "W_Q W_Kᵀ of a head, d_model × d_model, float64");
  m.def(
      "ov_circuit",
      [](const nn::Transformer& model, std::size_t layer, std::size_t head) {
        return matrix_array(nn::ov_circuit(attention_of(model, layer, head), head));
      },
      py::arg("model"), py::arg("layer"), py::arg("head"), "W_V W_O of a head, d_model × d_model, float64");
  m.def(
      "composition_score",
      [](const nn::Transformer& model, std::size_t l1, std::size_t h1, std::size_t l2, std::size_t h2, const std::string& kind) {
        const nn::Composition c = kind == "q" ? nn::Composition::q : kind == "k" ? nn::Composition::k : kind == "v" ? nn::Composition::v
                                  : throw std::invalid_argument(fmt::format("composition_score: kind '{}': q, k or v", kind));
        if (l1 >= l2) throw std::invalid_argument(fmt::format("composition_score: layer {} does not come before layer {}", l1, l2));
        return nn::composition_score(attention_of(model, l1, h1), h1, attention_of(model, l2, h2), h2, c);
      },
      py::arg("model"), py::arg("writer_layer"), py::arg("writer_head"), py::arg("reader_layer"), py::arg("reader_head"),
      py::arg("kind"), "How much the reader head's q, k or v input reads what the writer head writes (Elhage et al.)");
  m.def(
      "detect_heads",
      [](const nn::Transformer& model, const std::vector<std::vector<std::int64_t>>& sequences) {
        const std::vector<analysis::HeadDetection> found = analysis::detect_heads(model, sequences);
        const std::size_t L = model.config().layers, H = model.config().heads;
        py::dict out;
        for (const analysis::HeadKind kind : analysis::all_head_kinds) {
          py::array_t<double> scores({py::ssize_t(L), py::ssize_t(H)});
          auto view = scores.mutable_unchecked<2>();
          for (const analysis::HeadDetection& d : found) view(py::ssize_t(d.layer), py::ssize_t(d.head)) = d.score(kind);
          out[py::str(analysis::head_kind_name(kind))] = std::move(scores);
        }
        return out;
      },
      py::arg("model"), py::arg("sequences"),
      "TransformerLens's head detectors: for each of previous_token, duplicate_token and induction, a (layers, heads) "
      "array of the share of each head's attention on that kind's pattern, the mean over the sequences (lists of "
      "token ids, each run alone)");
  m.def("antisymmetry", [](const py::array& a) { return nn::antisymmetry(to_tensor(a, "antisymmetry").to(DType::float64).value<double>()); },
        py::arg("matrix"), "‖A − Aᵀ‖ / ‖A‖ of a square matrix, in [0, 2]: 2·√(1 − σ)");
  m.def(
      "score_asymmetry",
      [](const py::array& scores, const py::object& allowed) -> py::object {
        const Array<double> s = to_tensor(scores, "score_asymmetry").to(DType::float64).value<double>();
        // By default the scores that count: a masked one is −inf.
        const MaskArray mask = allowed.is_none() ? MaskArray(xt::isfinite(s)) : bool_matrix(allowed, "score_asymmetry: allowed");
        const std::optional<double> a = nn::softmax_invariant_asymmetry(s, mask);
        return a ? py::object(py::float_(*a)) : py::none();
      },
      py::arg("scores"), py::arg("allowed") = py::none(),
      "The asymmetry of one head's pre-softmax scores (T, T) that softmax can see: what of S − Sᵀ no per-query "
      "constant cancels, relative to ‖S‖ with rows centred, over the pairs that see each other both ways "
      "(allowed: booleans (T, T), true where query i may attend key j; none: where the scores are finite). None where "
      "no pair does");
  m.def(
      "spectrum",
      [](const py::array& a) {
        const nn::MatrixSpectrum sp = nn::spectrum(to_tensor(a, "spectrum").to(DType::float64).value<double>());
        py::dict out;
        out["singular_values"] = py::array_t<double>(py::ssize_t(sp.singular_values.size()), sp.singular_values.data());
        out["stable_rank"] = sp.stable_rank;
        out["rank"] = sp.rank;
        out["eigenvalues"] = py::array_t<std::complex<double>>(py::ssize_t(sp.eigenvalues.size()), sp.eigenvalues.data());
        return out;
      },
      py::arg("matrix"),
      "Singular values (descending), stable rank ‖A‖²_F/‖A‖²_2, numerical rank (numpy's rule) and, for a square "
      "matrix, eigenvalues by modulus, descending");
  m.def(
      "token_table",
      [](const nn::Transformer& model, std::size_t layer) { return table_array(model, layer, model.tok.weight); },
      py::arg("model"), py::arg("layer"),
      "(heads, vocab, vocab): the scores each head of the layer gives query token × key token, the stream holding "
      "only the token embeddings (after the layer's LayerNorm, biases included, scaled, no mask)");
  m.def(
      "position_table",
      [](const nn::Transformer& model, std::size_t layer) { return table_array(model, layer, model.position_table()); },
      py::arg("model"), py::arg("layer"), "(heads, max_len, max_len): the same with the position embeddings");
  m.def("symmetric_share", [](const py::array& a) { return nn::symmetric_share(to_tensor(a, "symmetric_share").to(DType::float64).value<double>()); },
        py::arg("matrix"), "σ: ‖(A + Aᵀ)/2‖² / ‖A‖² of a square matrix");
  m.def("load_run", &load_run, py::arg("dir"),
        "The model of a run folder at its committed checkpoint: a Transformer, or for a seq2seq task's run an "
        "EncoderDecoder");
  m.def("train", &train, py::arg("task"), py::arg("out") = py::none(), py::arg("force") = false, py::arg("resume") = false,
        py::arg("threads") = py::none(),
        "qkv train TASK with options as its long options (underscores for dashes), for a built-in task by name or a "
        "task written in Python; the final JSON object as a dict");
  m.def("register_task", &register_python_task, py::arg("task"),
        "Makes a task written in Python known by its name (its `name`, or its class's) in this process, as "
        "qkv.train does, so that load_run, evaluate, inspect and ablate read its runs; returns the name");
  m.def("tasks", [] { return tasks::task_names(); }, "The names of the tasks: the built-in ones, then those registered");
  m.def("sweep", &run_sweep, py::arg("spec"), py::arg("out"), py::arg("jobs") = 1, py::arg("index") = 0, py::arg("of") = 1,
        "`qkv sweep`: the runs of a sweep file (its path, or a dict in its form) in `out`, `jobs` at once (finished "
        "runs are skipped; with index/of, the index-th slice of `of`); then the results as results.csv's table: a "
        "pandas DataFrame when pandas is there, else a list of dicts");
  m.def(
      "sweep_results",
      [](const std::string& out, bool partial) { return collected(sweep::read_sweep(out + "/sweep.json"), out, partial); },
      py::arg("out"), py::arg("partial") = false,
      "`qkv sweep --collect`: the results of the sweep in `out` as a table (a DataFrame when pandas is there); a "
      "missing run is an OSError naming it, unless partial");
}
