#include "qkv/core/autograd.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <stdexcept>

#include <xtensor/xmath.hpp>

#include "qkv/core/detail/node.hpp"

namespace qkv {

using detail::AnyArray;
using detail::GradSlot;
using detail::Record;

namespace {

thread_local bool grad_enabled = true;
std::atomic<bool> anomaly_enabled{false};

// This thread's tape. Records whose output can no longer receive a gradient (nothing but the
// record itself holds its slot) are swept out from time to time, so a forward pass that is never
// differentiated (evaluation without NoGradGuard) does not grow the tape for ever.
struct Tape {
  std::vector<Record> records;
  std::size_t next_sweep = 1024;
};
thread_local Tape tape;

void sweep(Tape& t) {
  // Newest first: dropping a dead record releases its inputs, which may kill older records.
  for (std::size_t i = t.records.size(); i-- > 0;)
    if (t.records[i].output.use_count() == 1) t.records[i] = Record{};
  std::erase_if(t.records, [](const Record& r) { return r.output == nullptr; });
}

}  // namespace

NoGradGuard::NoGradGuard() : previous_(grad_enabled) { grad_enabled = false; }
NoGradGuard::~NoGradGuard() { grad_enabled = previous_; }
bool is_grad_enabled() { return grad_enabled; }

void set_detect_anomaly(bool enabled) { anomaly_enabled = enabled; }
bool is_anomaly_enabled() { return anomaly_enabled; }
DetectAnomalyGuard::DetectAnomalyGuard() : previous_(anomaly_enabled) { anomaly_enabled = true; }
DetectAnomalyGuard::~DetectAnomalyGuard() { anomaly_enabled = previous_; }

std::size_t tape_size() {
  sweep(tape);
  return tape.records.size();
}

namespace detail {

void push_record(Record record) {
  tape.records.push_back(std::move(record));
  if (tape.records.size() >= tape.next_sweep) {
    sweep(tape);
    tape.next_sweep = std::max<std::size_t>(1024, 2 * tape.records.size());
  }
}

template <class T>
void check_anomaly(std::string_view op, const Array<T>& result, const std::vector<const Tensor*>& inputs,
                   bool infinite_inputs) {
  const auto bad = std::find_if(result.begin(), result.end(), [](T v) { return !std::isfinite(v); });
  if (bad == result.end()) return;
  const auto index = static_cast<std::size_t>(bad - result.begin());
  if (std::isnan(*bad))
    throw std::runtime_error(fmt::format("{}: produced NaN at flat index {} of a result of shape {} "
                                         "(anomaly mode)", op, index, to_string(to_shape(result.shape()))));
  for (const Tensor* t : inputs) {
    if (!t->defined()) continue;
    const auto& v = t->value<T>();
    infinite_inputs = infinite_inputs || !std::all_of(v.begin(), v.end(), [](T x) { return std::isfinite(x); });
  }
  if (!infinite_inputs)
    throw std::runtime_error(fmt::format("{}: produced {} at flat index {} of a result of shape {} from "
                                         "finite inputs (anomaly mode)", op, *bad, index,
                                         to_string(to_shape(result.shape()))));
}

template void check_anomaly<float>(std::string_view, const Array<float>&, const std::vector<const Tensor*>&, bool);
template void check_anomaly<double>(std::string_view, const Array<double>&, const std::vector<const Tensor*>&, bool);

}  // namespace detail

namespace {

template <class T>
void add_into(GradSlot& slot, Array<T>&& g) {
  if (!slot.grad)
    slot.grad = detail::make_node(std::move(g));
  else
    detail::array_of<T>(slot.grad) += g;
}

// Reverse walk from the record that produced `root` (or from the end, for a leaf root).
void run_backward(const std::shared_ptr<GradSlot>& root, AnyArray seed, bool retain_graph) {
  auto& records = tape.records;
  std::size_t end = records.size();
  if (!root->is_leaf) {
    while (end > 0 && records[end - 1].output != root) --end;
    if (end == 0)
      throw std::runtime_error(
          "backward: the graph that produced this tensor is gone (an earlier backward cleared the "
          "tape); pass retain_graph=true to the first backward to call it again");
  }
  std::visit([&](auto& g) { add_into(*root, std::move(g)); }, seed);
  try {
    for (std::size_t i = end; i-- > 0;) {
      Record& r = records[i];
      if (!r.output->grad) continue;  // not on a path to the root
      r.backward(r);
      r.output->grad.reset();  // a non-leaf keeps no gradient, as in PyTorch
    }
  } catch (...) {
    for (Record& r : records) r.output->grad.reset();
    records.clear();
    throw;
  }
  if (!retain_graph) records.clear();
}

}  // namespace

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  if (!defined()) throw std::invalid_argument("backward: the tensor is undefined");
  if (!requires_grad())
    throw std::invalid_argument(
        "backward: the tensor does not require grad (no input of the ops that made it requires grad, "
        "or it was made under NoGradGuard)");
  AnyArray seed;
  if (!gradient.defined()) {
    if (numel() != 1)
      fail("backward", "the output has shape {}; pass a gradient of that shape for a non-scalar output",
           to_string(shape()));
    seed = std::visit([](const auto& a) -> AnyArray {
      auto ones = a;
      ones.fill(1);
      return ones;
    }, *node()->value);
  } else {
    if (gradient.dtype() != dtype() || gradient.shape() != shape())
      fail("backward", "gradient is {} {} but the output is {} {}", dtype_name(gradient.dtype()),
           to_string(gradient.shape()), dtype_name(dtype()), to_string(shape()));
    seed = *gradient.node()->value;  // a copy: the caller's gradient is not modified
  }
  run_backward(node()->slot, std::move(seed), retain_graph);
}

}  // namespace qkv
