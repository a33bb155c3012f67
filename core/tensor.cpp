#include "qkv/core/tensor.hpp"

#include <algorithm>
#include <stdexcept>

#include "qkv/core/detail/op.hpp"

namespace qkv {

using detail::AnyArray;
using detail::GradSlot;
using detail::Node;

namespace detail {

std::shared_ptr<Node> make_node(AnyArray value) {
  auto node = std::make_shared<Node>();
  node->value = std::make_shared<AnyArray>(std::move(value));
  return node;
}

void check_inputs(const char* op, const std::vector<const Tensor*>& inputs) {
  const Tensor* first = nullptr;
  std::size_t i = 0;
  for (const Tensor* t : inputs) {
    if (!t->defined()) fail(op, "input {} is an undefined tensor", i);
    if (first && t->dtype() != first->dtype())
      fail(op, "mixed dtypes {} and {} (input 0 is {}, input {} is {})", dtype_name(first->dtype()),
           dtype_name(t->dtype()), to_string(first->shape()), i, to_string(t->shape()));
    if (!first) first = t;
    ++i;
  }
}

}  // namespace detail

namespace {

const Node& checked(const std::shared_ptr<Node>& node, const char* what) {
  if (!node) throw std::invalid_argument(fmt::format("{}: the tensor is undefined", what));
  return *node;
}

template <class T>
std::shared_ptr<Node> leaf(Array<T> value, bool requires_grad) {
  auto node = detail::make_node(std::move(value));
  Tensor t(node);
  t.requires_grad_(requires_grad);
  return node;
}

}  // namespace

Tensor::Tensor(Array<float> value, bool requires_grad) : node_(leaf(std::move(value), requires_grad)) {}
Tensor::Tensor(Array<double> value, bool requires_grad) : node_(leaf(std::move(value), requires_grad)) {}

DType Tensor::dtype() const {
  return checked(node_, "dtype").value->index() == 0 ? DType::float32 : DType::float64;
}

Shape Tensor::shape() const {
  return std::visit([](const auto& a) { return to_shape(a.shape()); }, *checked(node_, "shape").value);
}

std::size_t Tensor::dim() const {
  return std::visit([](const auto& a) { return a.dimension(); }, *checked(node_, "dim").value);
}

std::size_t Tensor::size(std::int64_t axis) const { return shape()[normalize_axis("size", axis, dim())]; }

std::size_t Tensor::numel() const {
  return std::visit([](const auto& a) { return a.size(); }, *checked(node_, "numel").value);
}

template <class T>
const Array<T>& Tensor::value() const {
  const Node& n = checked(node_, "value");
  if (dtype() != dtype_of<T>())
    fail("value", "the tensor is {}, asked for {}", dtype_name(dtype()), dtype_name(dtype_of<T>()));
  return std::get<Array<T>>(*n.value);
}

template <class T>
Array<T>& Tensor::mutable_value() {
  value<T>();  // checks the dtype
  return std::get<Array<T>>(*node_->value);
}

template const Array<float>& Tensor::value<float>() const;
template const Array<double>& Tensor::value<double>() const;
template Array<float>& Tensor::mutable_value<float>();
template Array<double>& Tensor::mutable_value<double>();

double Tensor::item() const {
  if (numel() != 1) fail("item", "the tensor has shape {}, not one element", to_string(shape()));
  return std::visit([](const auto& a) { return static_cast<double>(*a.data()); }, *node_->value);
}

bool Tensor::requires_grad() const { return checked(node_, "requires_grad").slot != nullptr; }

bool Tensor::is_leaf() const {
  const Node& n = checked(node_, "is_leaf");
  return n.slot == nullptr || n.slot->is_leaf;
}

Tensor& Tensor::requires_grad_(bool requires_grad) {
  if (!is_leaf())
    fail("requires_grad_", "only a leaf can change requires_grad; use detach() on a computed tensor");
  if (!requires_grad) {
    node_->slot.reset();
  } else if (!node_->slot) {
    node_->slot = std::make_shared<GradSlot>();
    node_->slot->shape = shape();
    node_->slot->dtype = dtype();
  }
  return *this;
}

Tensor Tensor::grad() const {
  const Node& n = checked(node_, "grad");
  return n.slot && n.slot->grad ? Tensor(n.slot->grad) : Tensor();
}

void Tensor::zero_grad() {
  if (checked(node_, "zero_grad").slot) node_->slot->grad.reset();
}

Tensor Tensor::detach() const {
  auto node = std::make_shared<Node>();
  node->value = checked(node_, "detach").value;
  return Tensor(std::move(node));
}

Tensor& Tensor::copy_(const Tensor& source) {
  checked(node_, "copy_");
  checked(source.node_, "copy_");
  if (source.shape() != shape())
    fail("copy_", "source of shape {} into a tensor of shape {}", to_string(source.shape()), to_string(shape()));
  std::visit([](auto& to, const auto& from) { std::copy(from.begin(), from.end(), to.begin()); }, *node_->value,
             *source.node_->value);
  return *this;
}

Tensor& Tensor::set_data(const Tensor& source) {
  checked(node_, "set_data");
  checked(source.node_, "set_data");
  if (!is_leaf()) fail("set_data", "only a leaf's value can be replaced");
  node_->value = source.node_->value;
  if (node_->slot) {
    node_->slot->grad.reset();
    node_->slot->shape = shape();
    node_->slot->dtype = dtype();
  }
  return *this;
}

namespace {

template <class T>
Tensor filled(const Shape& shape, double value) {
  Array<T> a = Array<T>::from_shape(shape);
  a.fill(static_cast<T>(value));
  return Tensor(std::move(a));
}

}  // namespace

Tensor full(const Shape& shape, double value, DType dtype) {
  return dispatch(dtype, [&](auto t) { return filled<decltype(t)>(shape, value); });
}
Tensor zeros(const Shape& shape, DType dtype) { return full(shape, 0.0, dtype); }
Tensor ones(const Shape& shape, DType dtype) { return full(shape, 1.0, dtype); }
Tensor scalar(double value, DType dtype) { return full({}, value, dtype); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype()); }

}  // namespace qkv
