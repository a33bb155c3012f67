// cross_entropy fused with log_softmax: logits (..., C), integer targets (...).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/detail/kernels.hpp"
#include "core/detail/op.hpp"
#include "core/ops.hpp"

namespace qkv {

Tensor cross_entropy(const Tensor& logits, const IndexArray& targets, std::int64_t ignore_index) {
  check_inputs("cross_entropy", {&logits});
  const Shape sl = logits.shape(), st = to_shape(targets.shape());
  if (sl.empty() || Shape(sl.begin(), sl.end() - 1) != st)
    fail("cross_entropy", "logits {} need targets of shape {} (the class dimension is last), got {}",
         to_string(sl), sl.empty() ? "(...)" : to_string(Shape(sl.begin(), sl.end() - 1)), to_string(st));
  const std::size_t C = sl.back(), N = targets.size();
  std::size_t count = 0;
  for (std::size_t i = 0; i < N; ++i) {
    const std::int64_t t = targets.data()[i];
    if (t == ignore_index) continue;
    if (t < 0 || t >= std::int64_t(C))
      fail("cross_entropy", "target {} at flat index {} is out of range for {} classes (ignore_index is {})", t, i,
           C, ignore_index);
    ++count;
  }
  return dispatch(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    // Per row: lse = log Σ exp(x), max-subtracted; loss = mean over counted rows of lse − x[target].
    const T* x = logits.value<T>().data();
    std::vector<T> lse(N, T(0)), shifted(N * C);  // x − max of its row, then its exp
    for (std::size_t i = 0; i < N; ++i) {
      const T* row = x + i * C;
      const T m = C ? *std::max_element(row, row + C) : T(0);
      lse[i] = m;
      for (std::size_t c = 0; c < C; ++c) shifted[i * C + c] = row[c] - m;
    }
    detail::exp_in_place(shifted.data(), shifted.size());
    double total = 0;
    for (std::size_t i = 0; i < N; ++i) {
      if (targets.data()[i] == ignore_index) continue;
      T s = 0;
      for (std::size_t c = 0; c < C; ++c) s += shifted[i * C + c];
      lse[i] += std::log(s);
      total += double(lse[i] - x[i * C + std::size_t(targets.data()[i])]);
    }
    Array<T> y = T(count ? total / double(count) : 0.0);  // 0 when every target is ignored
    return record_op<T>("cross_entropy", std::move(y), {&logits},
                        [logits, targets, lse = std::move(lse), ignore_index, count, C](BackwardContext<T>& ctx) {
      // forward was L = mean(lse − x[t]), so dx = (softmax(x) − onehot(t)) · dL / count.
      if (count == 0) return ctx.accumulate(0, Array<T>(xt::zeros<T>(logits.shape())));
      Array<T> g = Array<T>::from_shape(logits.shape());
      const T scale = ctx.grad()() / T(count);
      const T* x = logits.value<T>().data();
      for (std::size_t i = 0; i < targets.size(); ++i)
        for (std::size_t c = 0; c < C; ++c) g.data()[i * C + c] = x[i * C + c] - lse[i];
      detail::exp_in_place(g.data(), g.size());
      for (std::size_t i = 0; i < targets.size(); ++i) {
        const std::int64_t t = targets.data()[i];
        T* gr = g.data() + i * C;
        for (std::size_t c = 0; c < C; ++c) gr[c] = t == ignore_index ? T(0) : gr[c] * scale;
        if (t != ignore_index) gr[t] -= scale;
      }
      ctx.accumulate(0, std::move(g));
    });
  });
}

}  // namespace qkv
