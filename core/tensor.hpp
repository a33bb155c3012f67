#pragma once
// Tensor: a cheap handle (shared ownership) to a value, its gradient, and its place on the tape.
//
//   Tensor w(xt::xarray<double>{{1, 2}, {3, 4}}, /*requires_grad=*/true);
//   Tensor loss = sum(matmul(x, w));
//   loss.backward();          // w.grad() now holds d loss / d w
//
// One type with a runtime dtype (float32 by default, float64 for gradient checks), as in PyTorch.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "qkv/core/xarray.hpp"

#include "qkv/core/dtype.hpp"
#include "qkv/core/shape.hpp"

namespace qkv {

template <class T>
using Array = xt::xarray<T, xt::layout_type::row_major>;
using IndexArray = xt::xarray<std::int64_t, xt::layout_type::row_major>;  // token ids, targets
using MaskArray = xt::xarray<bool, xt::layout_type::row_major>;           // masks

namespace detail {
struct Node;
}

class Tensor {
 public:
  Tensor() = default;  // undefined: no value
  explicit Tensor(Array<float> value, bool requires_grad = false);
  explicit Tensor(Array<double> value, bool requires_grad = false);

  bool defined() const { return node_ != nullptr; }
  DType dtype() const;
  Shape shape() const;
  std::size_t dim() const;
  std::size_t size(std::int64_t axis) const;
  std::size_t numel() const;

  // The value. T must match dtype(); a mismatch throws naming both.
  template <class T>
  const Array<T>& value() const;
  // In-place access for optimizers and gradient checks; not recorded on the tape.
  template <class T>
  Array<T>& mutable_value();
  // The single element of a one-element tensor, as double.
  double item() const;

  bool requires_grad() const;
  // Marks a leaf as a parameter whose gradient backward() accumulates.
  Tensor& requires_grad_(bool requires_grad = true);
  // True for tensors no recorded op produced (parameters, inputs, detached values).
  bool is_leaf() const;

  // The accumulated gradient: undefined until backward() reaches this tensor, and again after
  // zero_grad(). It shares storage with the accumulator, as PyTorch's .grad does.
  Tensor grad() const;
  void zero_grad();

  // Seeds d self = gradient (default 1 for a one-element tensor), walks the tape in reverse and
  // accumulates into every leaf that requires grad. Clears the tape unless retain_graph.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;

  // A leaf sharing this tensor's value, with no gradient history.
  Tensor detach() const;
  // A copy in another dtype; differentiable.
  Tensor to(DType dtype) const;

  // In place, not recorded: copies source's elements (converting the dtype) into this tensor,
  // whose shape must match. As torch's copy_ under no_grad; for loading parameters.
  Tensor& copy_(const Tensor& source);
  // Replaces a leaf's value (any shape or dtype) by source's, shared; drops the gradient. As
  // `param.data = source`; for converting a module's parameters.
  Tensor& set_data(const Tensor& source);

  // True when both handles refer to the same tensor.
  bool is_same(const Tensor& other) const { return node_ == other.node_; }

  const std::shared_ptr<detail::Node>& node() const { return node_; }
  explicit Tensor(std::shared_ptr<detail::Node> node) : node_(std::move(node)) {}

 private:
  std::shared_ptr<detail::Node> node_;
};

// Names to tensors, in order: module parameters, optimizer state, checkpoint contents.
using StateDict = std::vector<std::pair<std::string, Tensor>>;

// Factories. Shapes are row-major; dtype defaults to float32.
Tensor zeros(const Shape& shape, DType dtype = DType::float32);
Tensor ones(const Shape& shape, DType dtype = DType::float32);
Tensor full(const Shape& shape, double value, DType dtype = DType::float32);
Tensor scalar(double value, DType dtype = DType::float32);  // a 0-d tensor
Tensor zeros_like(const Tensor& t);

}  // namespace qkv
