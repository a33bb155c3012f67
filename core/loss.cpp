// cross_entropy fused with log_softmax: logits (..., C), integer targets (...).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "qkv/core/detail/blas.hpp"
#include "qkv/core/detail/kernels.hpp"
#include "qkv/core/detail/op.hpp"
#include "qkv/core/ops.hpp"

namespace qkv {

namespace {
constexpr std::size_t row_block = 256;  // rows per task of the pool's
}  // namespace

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
    // Per row: m = max, s = Σ exp(x − m); loss = mean over counted rows of (m − x[target]) + log s.
    // log s stays apart from m: m + log s would round log s at the scale of the largest logit, and
    // the loss would change with a shift of every logit, which leaves it unchanged in exact
    // arithmetic. Rows go to threads in blocks; the loss adds the rows' terms in row order.
    const T* x = logits.value<T>().data();
    const std::int64_t* t = targets.data();
    std::vector<T> max(N), log_sum(N), term(N);
    std::vector<T> shifted(N * C);  // x − max of its row, then its exp
    detail::parallel_ranges(N, row_block, [&](std::size_t lo, std::size_t hi) {
      for (std::size_t i = lo; i < hi; ++i) {
        const T* row = x + i * C;
        const T m = C ? *std::max_element(row, row + C) : T(0);
        max[i] = m;
        for (std::size_t c = 0; c < C; ++c) shifted[i * C + c] = row[c] - m;
      }
      detail::exp_in_place(shifted.data() + lo * C, (hi - lo) * C);
      for (std::size_t i = lo; i < hi; ++i) {
        if (t[i] == ignore_index) continue;
        log_sum[i] = std::log(detail::sum_of(shifted.data() + i * C, C));
        term[i] = (max[i] - x[i * C + std::size_t(t[i])]) + log_sum[i];
      }
    });
    double total = 0;
    for (std::size_t i = 0; i < N; ++i)
      if (t[i] != ignore_index) total += double(term[i]);
    Array<T> y = T(count ? total / double(count) : 0.0);  // 0 when every target is ignored
    return record_op<T>("cross_entropy", std::move(y), {&logits},
                        [logits, targets, max = std::move(max), log_sum = std::move(log_sum), ignore_index, count, C](BackwardContext<T>& ctx) {
      // forward was L = mean((m − x[t]) + log s), so dx = (softmax(x) − onehot(t)) · dL / count, with
      // softmax(x) = exp((x − m) − log s).
      if (count == 0) return ctx.accumulate(0, Array<T>(xt::zeros<T>(logits.shape())));
      Array<T> g = Array<T>::from_shape(logits.shape());
      const T scale = ctx.grad()() / T(count);
      const T* x = logits.value<T>().data();
      const std::int64_t* t = targets.data();
      detail::parallel_ranges(targets.size(), row_block, [&](std::size_t lo, std::size_t hi) {
        for (std::size_t i = lo; i < hi; ++i)
          for (std::size_t c = 0; c < C; ++c) g.data()[i * C + c] = (x[i * C + c] - max[i]) - log_sum[i];
        detail::exp_in_place(g.data() + lo * C, (hi - lo) * C);
        for (std::size_t i = lo; i < hi; ++i) {
          T* gr = g.data() + i * C;
          for (std::size_t c = 0; c < C; ++c) gr[c] = t[i] == ignore_index ? T(0) : gr[c] * scale;
          if (t[i] != ignore_index) gr[t[i]] -= scale;
        }
      });
      ctx.accumulate(0, std::move(g));
    });
  });
}

}  // namespace qkv
