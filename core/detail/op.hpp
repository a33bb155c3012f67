#pragma once
// How an op is written: compute the result, then hand record_op a backward function that pushes
// d output back to each input with ctx.accumulate (which adds, never assigns):
//
//   Array<T> y = a.value<T>() * b.value<T>();
//   return record_op<T>("mul", std::move(y), {&a, &b}, [a, b](BackwardContext<T>& ctx) {
//     ctx.accumulate(0, ctx.grad() * b.value<T>());
//     ...
//   });
//
// Included by core's op .cpp files only.
#include <initializer_list>
#include <type_traits>
#include <utility>

#include <xtensor/xmath.hpp>
#include <xtensor/xreducer.hpp>
#include <xtensor/xtensor.hpp>

#include "qkv/core/autograd.hpp"
#include "qkv/core/detail/kernels.hpp"
#include "qkv/core/detail/node.hpp"

namespace qkv::detail {

// Reducer options: keep the reduced axes (as 1s), and evaluate now.
inline const auto keep = xt::keep_dims | xt::evaluation_strategy::immediate;

// exp of an array or expression. float64 goes element by element through std::exp: xsimd's
// float64 exp converts its range reduction to int64 one lane at a time in plain C++, undefined
// behaviour for ±inf, NaN and huge inputs (lanes it then discards). float32 stays with xsimd.
template <class T, class E>
Array<T> exp_of(const E& e) {
  if constexpr (std::is_same_v<T, double>) {
    Array<T> out = e;
    exp_in_place(out.data(), out.size());
    return out;
  } else {
    return xt::exp(e);
  }
}

// x summed over `axes` (ascending, distinct), each kept as a dimension of size 1, in the cascade
// of add_column_sums (core/detail/kernels.hpp): every sum, mean, broadcast gradient and softmax
// denominator of an array goes through it. float and double; defined in reduce.cpp.
template <class T>
Array<T> sum_over(const Array<T>& x, const std::vector<std::size_t>& axes);

template <class T>
class BackwardContext {
 public:
  BackwardContext(Record& record, const Array<T>& grad) : record_(record), grad_(grad) {}

  // d loss / d output.
  const Array<T>& grad() const { return grad_; }
  // The op's output; only for ops recorded with Save::output.
  const Array<T>& output() const { return std::get<Array<T>>(*record_.saved_output); }
  // Whether input i needs a gradient; skip work when not.
  bool needs(std::size_t i) const { return record_.inputs[i] != nullptr; }

  // input_i.grad += g, where g is an array or an xtensor expression of the input's shape and
  // dtype (the input's dtype may differ from the output's only for cast). When g is d output
  // itself (grad()) and the input has no gradient yet, the input takes that array rather than a
  // copy: the tape drops the output's gradient once this backward returns, so nothing else sees
  // it change.
  template <class E>
  void accumulate(std::size_t i, E&& g) {
    using V = typename std::decay_t<E>::value_type;
    GradSlot* slot = record_.inputs[i].get();
    if (slot == nullptr) return;
    const Shape g_shape = to_shape(g.shape());
    if (g_shape != slot->shape || dtype_of<V>() != slot->dtype)
      throw std::logic_error(fmt::format("{} backward: gradient {} {} for input {} of {} {}", record_.op,
                                         dtype_name(dtype_of<V>()), to_string(g_shape), i,
                                         dtype_name(slot->dtype), to_string(slot->shape)));
    if (!slot->grad) {
      slot->grad = hands_on(g) ? record_.output->grad : make_node(Array<V>(std::forward<E>(g)));
    } else if constexpr (std::is_same_v<std::decay_t<E>, Array<V>>) {
      Array<V>& sum = array_of<V>(slot->grad);  // a vectorised loop rather than xtensor's
      add_rows(sum.data(), 1, sum.size(), g.data(), sum.data());
    } else {
      array_of<V>(slot->grad) += std::forward<E>(g);
    }
    if (is_anomaly_enabled())
      check_anomaly(fmt::format("{} backward", record_.op), array_of<V>(slot->grad), {}, false);
  }

 private:
  // Whether g is d output itself, held by nothing but the output's slot.
  template <class E>
  bool hands_on(const E& g) const {
    if constexpr (std::is_same_v<E, Array<T>>)
      return &g == &grad_ && record_.output->grad.use_count() == 1;
    return false;
  }

  Record& record_;
  const Array<T>& grad_;
};

enum class Save { nothing, output };

// Wraps `result` in a Tensor and, when grad mode is on and an input requires grad, records the
// op. `infinite_inputs` tells anomaly mode that an Inf in the result came from an argument.
template <class T, class Backward>
Tensor record_op(const char* op, Array<T>&& result, const std::vector<const Tensor*>& ins,
                 Backward&& backward, Save save = Save::nothing, bool infinite_inputs = false) {
  if (is_anomaly_enabled()) check_anomaly(op, result, ins, infinite_inputs);
  auto node = make_node(std::move(result));
  // An undefined input is an absent optional argument (layer_norm without weight): no gradient.
  const auto wants_grad = [](const Tensor* t) { return t->defined() && t->requires_grad(); };
  bool needs_grad = false;
  for (const Tensor* t : ins) needs_grad = needs_grad || wants_grad(t);
  if (!needs_grad || !is_grad_enabled()) return Tensor(std::move(node));

  node->slot = std::make_shared<GradSlot>();
  node->slot->shape = to_shape(array_of<T>(node).shape());
  node->slot->dtype = dtype_of<T>();
  node->slot->is_leaf = false;
  Record record;
  record.op = op;
  for (const Tensor* t : ins) record.inputs.push_back(wants_grad(t) ? t->node()->slot : nullptr);
  record.output = node->slot;
  if (save == Save::output) record.saved_output = node->value;
  record.backward = [f = std::forward<Backward>(backward)](Record& r) mutable {
    BackwardContext<T> ctx(r, array_of<T>(r.output->grad));
    f(ctx);
  };
  push_record(std::move(record));
  return Tensor(std::move(node));
}

// Runs f(T{}) for the tensor's dtype: the one place an op's template meets the runtime dtype.
template <class F>
decltype(auto) dispatch(DType dtype, F&& f) {
  if (dtype == DType::float32) return f(float{});
  return f(double{});
}

// Every input defined and of one dtype; throws naming the op.
void check_inputs(const char* op, const std::vector<const Tensor*>& inputs);

}  // namespace qkv::detail

namespace qkv {
// The vocabulary of an op's .cpp file.
using detail::BackwardContext;
using detail::check_inputs;
using detail::dispatch;
using detail::record_op;
using detail::Save;
using detail::sum_over;
}  // namespace qkv
