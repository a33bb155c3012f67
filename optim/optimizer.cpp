#include "qkv/optim/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/ranges.h>

namespace qkv::optim {

Optimizer::Optimizer(std::vector<Tensor> params, double lr)
    : params_(std::move(params)), buffers_(params_.size()), steps_(params_.size(), 0.0) {
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (!params_[i].defined() || !params_[i].is_leaf())
      fail("Optimizer", "parameter {} must be a defined leaf tensor", i);
  set_lr(lr);
}

void Optimizer::set_lr(double lr) {
  if (!(lr >= 0) || !std::isfinite(lr)) fail("Optimizer", "invalid learning rate lr = {}", lr);
  lr_ = lr;
}

void Optimizer::zero_grad() {
  for (Tensor& p : params_) p.zero_grad();
}

void Optimizer::step() {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    if (!p.requires_grad()) continue;
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    update(i, p, g);
  }
}

Tensor Optimizer::buffer(std::size_t i, const std::string& name) {
  for (auto& [n, t] : buffers_[i])
    if (n == name) return t;
  buffers_[i].emplace_back(name, zeros_like(params_[i]));
  return buffers_[i].back().second;
}

bool Optimizer::has_buffer(std::size_t i, const std::string& name) const {
  return std::any_of(buffers_[i].begin(), buffers_[i].end(), [&](const auto& b) { return b.first == name; });
}

StateDict Optimizer::state_dict() const {
  StateDict out;
  out.emplace_back("lr", scalar(lr_, DType::float64));
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (steps_[i] == 0) continue;  // never updated: no state, as in PyTorch
    out.emplace_back(fmt::format("{}.step", i), scalar(steps_[i], DType::float64));
    for (const auto& [name, t] : buffers_[i]) out.emplace_back(fmt::format("{}.{}", i, name), t.detach().to(t.dtype()));
  }
  return out;
}

namespace {

// A buffer a run could have reached: finite, and not negative where it holds squares.
void check_values(const std::string& name, const Tensor& t, bool nonnegative) {
  const Array<double> values = t.to(DType::float64).value<double>();
  for (std::size_t j = 0; j < values.size(); ++j) {
    const double v = values.data()[j];
    if (!std::isfinite(v) || (nonnegative && v < 0))
      fail("Optimizer::load_state_dict", "'{}' holds {} at element {}{}", name, v, j,
           std::isfinite(v) ? ", but an average of squares cannot be negative" : "");
  }
}

}  // namespace

void Optimizer::load_state_dict(const StateDict& state) {
  std::vector<StateDict> buffers(params_.size());
  std::vector<double> steps(params_.size(), 0.0);
  std::vector<bool> has_step(params_.size(), false);
  double lr = lr_;
  bool has_lr = false;
  const std::vector<std::string> known = buffer_names(), nonnegative = nonnegative_buffers();
  const auto repeated = [](const std::string& name) {
    fail("Optimizer::load_state_dict", "entry '{}' appears twice", name);
  };
  for (const auto& [name, t] : state) {
    if (name == "lr") {
      if (has_lr) repeated(name);
      has_lr = true;
      lr = t.item();
      continue;
    }
    const auto dot = name.find('.');
    const std::string index = name.substr(0, dot), field = dot == std::string::npos ? "" : name.substr(dot + 1);
    const std::size_t i = parse_count(index).value_or(params_.size());
    if (i >= params_.size() || (field != "step" && std::find(known.begin(), known.end(), field) == known.end()))
      fail("Optimizer::load_state_dict", "unexpected entry '{}' for {} parameters with state {}", name,
           params_.size(), fmt::join(known, ", "));
    if (t.numel() != 1 && field == "step") fail("Optimizer::load_state_dict", "'{}' is not one number", name);
    if (field == "step") {
      if (has_step[i]) repeated(name);
      has_step[i] = true;
      steps[i] = t.item();
      if (!(steps[i] >= 1 && steps[i] <= 0x1p53) || steps[i] != std::floor(steps[i]))
        fail("Optimizer::load_state_dict", "'{}' = {} is not a step count", name, steps[i]);
    } else {
      if (t.shape() != params_[i].shape() || t.dtype() != params_[i].dtype())
        fail("Optimizer::load_state_dict", "'{}' is {} {} but parameter {} is {} {}", name, dtype_name(t.dtype()),
             to_string(t.shape()), i, dtype_name(params_[i].dtype()), to_string(params_[i].shape()));
      if (std::any_of(buffers[i].begin(), buffers[i].end(), [&](const auto& b) { return b.first == field; })) repeated(name);
      check_values(name, t, std::find(nonnegative.begin(), nonnegative.end(), field) != nonnegative.end());
      buffers[i].emplace_back(field, t.detach().to(t.dtype()));  // a copy: the caller's tensors stay theirs
    }
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!has_step[i] && !buffers[i].empty())
      fail("Optimizer::load_state_dict", "parameter {} has '{}.{}' but no '{}.step'", i, i, buffers[i][0].first, i);
    if (has_step[i] && buffers[i].size() != known.size())
      for (const std::string& name : known)
        if (std::none_of(buffers[i].begin(), buffers[i].end(), [&](const auto& b) { return b.first == name; }))
          fail("Optimizer::load_state_dict", "parameter {} has a step count but no '{}.{}'", i, i, name);
  }
  set_lr(lr);
  buffers_ = std::move(buffers);
  steps_ = std::move(steps);
}

namespace {

// f(gradient array) for every parameter that has a gradient, in its own dtype.
template <class F>
void visit_grads(const std::vector<Tensor>& params, F f) {
  for (const Tensor& p : params) {
    Tensor g = p.defined() ? p.grad() : Tensor();
    if (!g.defined()) continue;
    if (g.dtype() == DType::float32)
      f(g.mutable_value<float>());
    else
      f(g.mutable_value<double>());
  }
}

}  // namespace

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  if (!(max_norm >= 0)) fail("clip_grad_norm", "max_norm must be non-negative, got {}", max_norm);
  double total = 0;
  visit_grads(params, [&](const auto& g) {
    for (auto v : g) total += double(v) * double(v);
  });
  const double norm = std::sqrt(total);
  if (!std::isfinite(norm)) throw std::runtime_error(fmt::format("clip_grad_norm: the total gradient norm is {}", norm));
  const double scale = max_norm / (norm + 1e-6);
  if (scale < 1) visit_grads(params, [&](auto& g) { g *= static_cast<typename std::decay_t<decltype(g)>::value_type>(scale); });
  return norm;
}

void clip_grad_value(const std::vector<Tensor>& params, double clip_value) {
  if (!(clip_value >= 0)) fail("clip_grad_value", "clip_value must be non-negative, got {}", clip_value);
  visit_grads(params, [&](auto& g) {
    using T = typename std::decay_t<decltype(g)>::value_type;
    for (T& v : g) v = std::clamp(v, T(-clip_value), T(clip_value));
  });
}

}  // namespace qkv::optim
