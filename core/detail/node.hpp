#pragma once
// Internals of Tensor and the tape. Included by core's .cpp files only.
#include <functional>
#include <memory>
#include <variant>
#include <vector>

#include "qkv/core/tensor.hpp"

namespace qkv::detail {

using AnyArray = std::variant<Array<float>, Array<double>>;

struct Node;

// Where the gradient of one tensor that requires grad accumulates.
struct GradSlot {
  std::shared_ptr<Node> grad;  // null until backward reaches it
  Shape shape;                 // of the tensor (and so of its gradient)
  DType dtype = DType::float32;
  bool is_leaf = true;
};

struct Node {
  std::shared_ptr<AnyArray> value;  // shared with detach()
  std::shared_ptr<GradSlot> slot;   // non-null iff the tensor requires grad
};

std::shared_ptr<Node> make_node(AnyArray value);

// One op on the tape. Its backward reads d output from output->grad and accumulates into the
// inputs' slots. It holds only what that needs: the slots, the values it captured, and the
// output value when asked (softmax keeps its output, not its input).
struct Record {
  const char* op = "";
  std::vector<std::shared_ptr<GradSlot>> inputs;  // null where the input needs no gradient
  std::shared_ptr<GradSlot> output;
  std::shared_ptr<const AnyArray> saved_output;
  std::function<void(Record&)> backward;
};

void push_record(Record record);

// Anomaly mode's check of a result: NaN always fails; Inf fails unless an input was infinite.
template <class T>
void check_anomaly(std::string_view op, const Array<T>& result, const std::vector<const Tensor*>& inputs,
                   bool infinite_inputs);

template <class T>
Array<T>& array_of(const std::shared_ptr<Node>& node) { return std::get<Array<T>>(*node->value); }

}  // namespace qkv::detail
