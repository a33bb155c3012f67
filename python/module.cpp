// qkv._qkv, the compiled half of `import qkv` (python/qkv/__init__.py): the library's calls on
// numpy arrays. Arrays qkv returns share the tensors' memory (read-only: a tensor's values do not
// change under it), and an array qkv returned comes back in as the same tensor, without a copy.
// Errors arrive as Python exceptions with the library's message: ValueError for bad arguments and
// options, OSError for run folders and files.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <malloc.h>

#include <cstdint>
#include <memory>
#include <sstream>
#include <streambuf>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/core/autograd.hpp"
#include "qkv/core/runtime.hpp"
#include "qkv/core/tensor.hpp"
#include "qkv/core/random.hpp"
#include "qkv/nn/detail/transformer_json.hpp"
#include "qkv/nn/circuits.hpp"
#include "qkv/nn/generate.hpp"
#include "qkv/report/ablate.hpp"
#include "qkv/report/alignment.hpp"
#include "qkv/report/inspect.hpp"
#include "qkv/training/run_analysis.hpp"
#include "qkv/nn/transformer.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/training/options.hpp"
#include "qkv/training/run_folder.hpp"
#include "qkv/training/run_options.hpp"
#include "qkv/training/trainer.hpp"
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

// Token ids, (T) or (B, T), as the model's (B, T) input; a ValueError for other shapes or dtypes.
IndexArray to_tokens(const py::handle& given) {
  const py::array array = py::array::ensure(given);
  if (!array || (array.dtype().kind() != 'i' && array.dtype().kind() != 'u'))
    throw std::invalid_argument("tokens: an array (or list) of integer token ids, (T) or (B, T)");
  const auto ids = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(array);
  if (ids.ndim() != 1 && ids.ndim() != 2)
    throw std::invalid_argument(fmt::format("tokens: shape of {} dimensions; (T) or (B, T)", ids.ndim()));
  const std::size_t B = ids.ndim() == 2 ? std::size_t(ids.shape(0)) : 1, T = std::size_t(ids.shape(ids.ndim() - 1));
  IndexArray out = IndexArray::from_shape({B, T});
  std::copy_n(ids.data(), ids.size(), out.data());
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

// Python values (str, int, float, bool) as JSON, for the option table.
nlohmann::json json_of(const py::handle& v, const std::string& name) {
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>();
  if (py::isinstance<py::int_>(v)) return v.cast<std::int64_t>();
  if (py::isinstance<py::float_>(v)) return v.cast<double>();
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  throw std::invalid_argument(fmt::format("{}: a number, text or True/False, not {}", name, std::string(py::str(v.get_type()))));
}

// qkv.train(task, out=None, force=False, threads=1, **options): `qkv train TASK` with options named
// as its long options (underscores for dashes); its final JSON object as a dict.
py::object train(const std::string& task, const py::object& out, bool force, std::size_t threads, const py::kwargs& options) {
  nlohmann::json given = nlohmann::json::object();
  for (const auto& [key, value] : options) given[key.cast<std::string>()] = json_of(value, key.cast<std::string>());
  tasks::task_spec(task);  // an unknown task, named as such
  tasks::TrainOptions o;
  try {
    o = training::run_options(task, given);
  } catch (const training::RunOptionError& e) {
    throw std::invalid_argument(fmt::format("train: '{}' {}", e.option, e.what()));
  }
  o.out = out.is_none() ? "runs/" + task : out.cast<std::string>();
  o.force = force;
  const std::size_t before = get_num_threads();
  set_num_threads(threads);
  PythonStderr buffer;
  std::ostream progress(&buffer);
  training::TrainResult r;
  try {
    const py::gil_scoped_release free;
    r = training::train(o, progress, false);
  } catch (const training::OptionError& e) {
    set_num_threads(before);
    const std::string option = training::option_of_field(e.field);
    throw std::invalid_argument(fmt::format("train: '{}' {}", option.empty() ? e.field : option, e.what()));
  } catch (...) {
    set_num_threads(before);
    throw;
  }
  set_num_threads(before);
  progress.flush();
  return python_of(training::result_json(o, r));
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
training::RunInspection inspection_of(const std::string& dir, const py::object& input, bool history) {
  std::optional<std::vector<std::int64_t>> ids;
  if (!input.is_none()) {
    const IndexArray tokens = to_tokens(input);
    if (tokens.shape()[0] != 1) throw std::invalid_argument("input: one sequence of token ids");
    ids = std::vector<std::int64_t>(tokens.begin(), tokens.end());
  }
  return training::inspect_run(dir, ids, history);
}

// A config as a dict (config.json's "model") read as the library reads the file's; ValueError
// naming the field.
nn::TransformerConfig config_of(const py::dict& config) {
  nlohmann::json j = nn::detail::transformer_config_json(nn::TransformerConfig{});  // what is not given: the defaults
  const nlohmann::json given = nlohmann::json::parse(py::module_::import("json").attr("dumps")(config).cast<std::string>());
  for (const auto& [key, value] : given.items()) j[key] = value;
  try {
    return nn::detail::read_transformer_config(j, "config", "");
  } catch (const std::runtime_error& e) {
    throw std::invalid_argument(e.what());
  }
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

  py::class_<nn::Transformer, std::shared_ptr<nn::Transformer>>(m, "Transformer", "A decoder-only model")
      .def(
          "__call__",
          [](const nn::Transformer& model, const py::handle& tokens) {
            const NoGradGuard no_grad;
            return to_numpy(model.forward(to_tokens(tokens)).logits);
          },
          py::arg("tokens"), "Logits (B, T, classes), or for the pointer readout head 0's scores (B, T, T)")
      .def(
          "run_with_cache",
          [](nn::Transformer& model, const py::handle& tokens, const py::object& names_filter) {
            const NoGradGuard no_grad;
            const nn::ActivationCache cache = model.run_with_cache(to_tokens(tokens), filter_of(names_filter));
            py::dict activations;
            for (const auto& [name, value] : cache.activations) activations[py::str(name)] = to_numpy(value);
            return py::make_tuple(to_numpy(cache.output.logits), activations);
          },
          py::arg("tokens"), py::arg("names_filter") = py::none(),
          "(logits, cache): the activation at every hook point names_filter keeps (None: all; a name, a list of "
          "names, or a predicate), by its TransformerLens name")
      .def(
          "run_with_hooks",
          [](nn::Transformer& model, const py::handle& tokens, const std::vector<std::pair<std::string, py::function>>& fwd_hooks) {
            nn::NamedHooks hooks;
            for (const auto& [name, fn] : fwd_hooks)
              hooks.emplace_back(name, [fn](const Tensor& value, const std::string& point) {
                const py::object replaced = fn(to_numpy(value), Hook{point});
                return replaced.is_none() ? value : to_tensor(py::array::ensure(replaced), point.c_str());
              });
            const NoGradGuard no_grad;
            return to_numpy(model.run_with_hooks(to_tokens(tokens), hooks).logits);
          },
          py::arg("tokens"), py::arg("fwd_hooks"),
          "Logits with hooks: each (name, fn) calls fn(activation, hook) at the point, which returns None (go on with "
          "it) or an array of the same shape to go on with instead")
      .def("hook_names", &nn::Transformer::hook_names, "Every hook point's name")
      .def(py::init([](const py::dict& config, std::uint64_t seed) {
             Generator gen(seed);
             return std::make_shared<nn::Transformer>(config_of(config), gen);
           }),
           py::arg("config"), py::arg("seed") = 0,
           "A new model from a config (as config.json's \"model\" holds it; unset fields at their defaults), its "
           "parameters drawn from `seed` as qkv train draws them")
      .def(
          "state_dict",
          [](const nn::Transformer& model) {
            py::dict out;
            for (const auto& [name, p] : model.state_dict()) out[py::str(name)] = to_numpy(p);
            return out;
          },
          "Every parameter by name, trainable or frozen, as arrays that share the model's memory")
      .def(
          "load_state_dict",
          [](nn::Transformer& model, const py::dict& state) {
            StateDict values;
            for (const auto& [name, value] : state)
              values.emplace_back(name.cast<std::string>(), to_tensor(py::array::ensure(value), "load_state_dict"));
            model.load_state_dict(values);
          },
          py::arg("state"), "Copies the arrays into the parameters of the same names (ValueError listing any missing, "
          "unexpected or mis-shaped name; then nothing has changed)")
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
      [](const std::string& name, std::size_t n) { return std::shared_ptr<tasks::Task>(tasks::make_task(name, n)); },
      py::arg("name"), py::arg("n") = 0, "A built-in task, as the program makes it (n: its size, for line and cycle; 0: the default)");
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
        const training::RunInspection r = inspection_of(dir, input, true);
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
  m.def("symmetric_share", [](const py::array& a) { return nn::symmetric_share(to_tensor(a, "symmetric_share").to(DType::float64).value<double>()); },
        py::arg("matrix"), "σ: ‖(A + Aᵀ)/2‖² / ‖A‖² of a square matrix");
  m.def("load_run", [](const std::string& dir) { return std::shared_ptr<nn::Transformer>(training::load_model(dir)); },
        py::arg("dir"), "The model of a run folder (decoder-only), at its committed checkpoint");
  m.def("train", &train, py::arg("task"), py::arg("out") = py::none(), py::arg("force") = false, py::arg("threads") = 1,
        "qkv train TASK with options as its long options (underscores for dashes); the final JSON object as a dict");
  m.def("tasks", [] { return tasks::task_names(); }, "The names of the built-in tasks");
}
