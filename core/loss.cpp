// cross_entropy fused with log_softmax: logits (..., C), integer targets (...).
#include <cmath>
#include <limits>

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
    std::vector<T> lse(N, T(0));
    double total = 0;
    for (std::size_t i = 0; i < N; ++i) {
      if (targets.data()[i] == ignore_index) continue;
      const T* row = x + i * C;
      T m = -std::numeric_limits<T>::infinity();
      for (std::size_t c = 0; c < C; ++c) m = std::max(m, row[c]);
      T s = 0;
      for (std::size_t c = 0; c < C; ++c) s += std::exp(row[c] - m);
      lse[i] = m + std::log(s);
      total += double(lse[i] - row[targets.data()[i]]);
    }
    Array<T> y = T(count ? total / double(count) : 0.0);  // 0 when every target is ignored
    return record_op<T>("cross_entropy", std::move(y), {&logits},
                        [logits, targets, lse = std::move(lse), ignore_index, count, C](BackwardContext<T>& ctx) {
      // forward was L = mean(lse − x[t]), so dx = (softmax(x) − onehot(t)) · dL / count.
      Array<T> g = xt::zeros<T>(logits.shape());
      if (count == 0) return ctx.accumulate(0, std::move(g));
      const T scale = ctx.grad()() / T(count);
      const T* x = logits.value<T>().data();
      for (std::size_t i = 0; i < targets.size(); ++i) {
        const std::int64_t t = targets.data()[i];
        if (t == ignore_index) continue;
        T* gr = g.data() + i * C;
        for (std::size_t c = 0; c < C; ++c) gr[c] = std::exp(x[i * C + c] - lse[i]) * scale;
        gr[t] -= scale;
      }
      ctx.accumulate(0, std::move(g));
    });
  });
}

}  // namespace qkv
