// scaled_dot_product_attention: every head of a batch at once, heads packed in the last dimension.
// Per batch entry b and head h, with Q, K, V the head's (rows × d) slices read in place:
//   S = scale · Q Kᵀ,  P = softmax over the keys each query may attend,  O = P V.
// Backward, from dO:
//   dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P ⊙ (dP − rowsum(P ⊙ dP)),  dQ = scale · dS K,  dK = scale · dSᵀ Q.
// It keeps P for backward and nothing else. Work is split across threads by (b, kv head); the
// G = H / Hkv query heads that share a kv head run in order on one thread, since their dK and dV
// add up.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "core/detail/blas.hpp"
#include "core/detail/op.hpp"
#include "core/ops.hpp"

namespace qkv {

namespace {

constexpr const char* op_name = "scaled_dot_product_attention";

struct Layout {
  std::size_t B, Tq, Tk, H, Hkv, G, dh, dv;
  bool causal;
  const bool* allowed;  // (B, H, Tq, Tk) or null
  // Keys [0, limit) may be seen by query i, before the `allowed` mask.
  std::size_t limit(std::size_t i) const { return causal ? std::min(Tk, Tk - Tq + i + 1) : Tk; }
  const bool* allowed_row(std::size_t b, std::size_t h, std::size_t i) const {
    return allowed ? allowed + ((b * H + h) * Tq + i) * Tk : nullptr;
  }
};

// Scores in S (Tq × Tk, row-major) become weights in place: softmax over each row's visible keys,
// exactly zero elsewhere, and a row with no visible key all zero.
template <class T>
void softmax_rows(T* S, const Layout& L, std::size_t b, std::size_t h) {
  for (std::size_t i = 0; i < L.Tq; ++i) {
    T* row = S + i * L.Tk;
    const std::size_t n = L.limit(i);
    const bool* ok = L.allowed_row(b, h, i);
    T m = -std::numeric_limits<T>::infinity();
    for (std::size_t j = 0; j < n; ++j)
      if (!ok || ok[j]) m = std::max(m, row[j]);
    if (m == -std::numeric_limits<T>::infinity()) {  // nothing visible (or every score -inf)
      std::fill(row, row + L.Tk, T(0));
      continue;
    }
    T total = 0;
    for (std::size_t j = 0; j < n; ++j) {
      const T e = (!ok || ok[j]) ? std::exp(row[j] - m) : T(0);
      row[j] = e;
      total += e;
    }
    const T inv = T(1) / total;
    for (std::size_t j = 0; j < n; ++j) row[j] *= inv;
    std::fill(row + n, row + L.Tk, T(0));
  }
}

// A per-thread scratch matrix, reused across calls.
template <class T>
T* scratch(std::size_t n) {
  thread_local std::vector<T> buffer;
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

template <class T>
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, Layout L, T scale) {
  const bool record = is_grad_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  const std::size_t ldq = L.H * L.dh, ldk = L.Hkv * L.dh, ldv = L.Hkv * L.dv, ldo = L.H * L.dv;
  Array<T> out = Array<T>::from_shape({L.B, L.Tq, ldo});
  // The weights of every head when backward needs them; otherwise one scratch matrix per thread.
  auto weights = std::make_shared<Array<T>>();
  if (record) *weights = Array<T>::from_shape({L.B, L.H, L.Tq, L.Tk});
  const T* Q = q.value<T>().data();
  const T* K = k.value<T>().data();
  const T* V = v.value<T>().data();
  T* O = out.data();
  detail::parallel_for(L.B * L.Hkv, [&](std::size_t task) {
    const std::size_t b = task / L.Hkv, kv = task % L.Hkv;
    const T* Kb = K + b * L.Tk * ldk + kv * L.dh;
    const T* Vb = V + b * L.Tk * ldv + kv * L.dv;
    for (std::size_t h = kv * L.G; h < (kv + 1) * L.G; ++h) {
      T* P = record ? weights->data() + (b * L.H + h) * L.Tq * L.Tk : scratch<T>(L.Tq * L.Tk);
      detail::gemm(false, true, L.Tq, L.Tk, L.dh, scale, Q + b * L.Tq * ldq + h * L.dh, ldq, Kb, ldk, T(0), P, L.Tk);
      softmax_rows(P, L, b, h);
      detail::gemm(false, false, L.Tq, L.dv, L.Tk, T(1), P, L.Tk, Vb, ldv, T(0), O + b * L.Tq * ldo + h * L.dv, ldo);
    }
  });
  if (!record) return Tensor(std::move(out));
  L.allowed = nullptr;  // backward needs no mask: a masked weight is exactly 0, so is its dS
  return record_op<T>(op_name, std::move(out), {&q, &k, &v}, [q, k, v, L, scale, weights](BackwardContext<T>& ctx) {
    const std::size_t ldq = L.H * L.dh, ldk = L.Hkv * L.dh, ldv = L.Hkv * L.dv, ldo = L.H * L.dv;
    const T* Q = q.value<T>().data();
    const T* K = k.value<T>().data();
    const T* V = v.value<T>().data();
    const T* dO = ctx.grad().data();
    const bool need_q = ctx.needs(0), need_k = ctx.needs(1), need_v = ctx.needs(2);
    // Every slice of dq, dk and dv is written (beta 0 for a kv head's first query head).
    Array<T> dq = need_q ? Array<T>::from_shape(q.shape()) : Array<T>();
    Array<T> dk = need_k ? Array<T>::from_shape(k.shape()) : Array<T>();
    Array<T> dv = need_v ? Array<T>::from_shape(v.shape()) : Array<T>();
    detail::parallel_for(L.B * L.Hkv, [&](std::size_t task) {
      const std::size_t b = task / L.Hkv, kv = task % L.Hkv;
      const std::size_t k_off = b * L.Tk * ldk + kv * L.dh, v_off = b * L.Tk * ldv + kv * L.dv;
      T* dS = scratch<T>(L.Tq * L.Tk);
      for (std::size_t h = kv * L.G; h < (kv + 1) * L.G; ++h) {
        const T beta = h == kv * L.G ? T(0) : T(1);
        const T* P = weights->data() + (b * L.H + h) * L.Tq * L.Tk;
        const T* dOh = dO + b * L.Tq * ldo + h * L.dv;
        const std::size_t q_off = b * L.Tq * ldq + h * L.dh;
        if (need_v) detail::gemm(true, false, L.Tk, L.dv, L.Tq, T(1), P, L.Tk, dOh, ldo, beta, dv.data() + v_off, ldv);
        if (!need_q && !need_k) continue;
        detail::gemm(false, true, L.Tq, L.Tk, L.dv, T(1), dOh, ldo, V + v_off, ldv, T(0), dS, L.Tk);
        for (std::size_t i = 0; i < L.Tq; ++i) {
          const T* p = P + i * L.Tk;
          T* d = dS + i * L.Tk;
          const std::size_t n = L.limit(i);
          T c = 0;
          for (std::size_t j = 0; j < n; ++j) c += p[j] * d[j];
          for (std::size_t j = 0; j < n; ++j) d[j] = p[j] * (d[j] - c);
          std::fill(d + n, d + L.Tk, T(0));
        }
        if (need_q) detail::gemm(false, false, L.Tq, L.dh, L.Tk, scale, dS, L.Tk, K + k_off, ldk, T(0), dq.data() + q_off, ldq);
        if (need_k) detail::gemm(true, false, L.Tk, L.dh, L.Tq, scale, dS, L.Tk, Q + q_off, ldq, beta, dk.data() + k_off, ldk);
      }
    });
    if (need_q) ctx.accumulate(0, std::move(dq));
    if (need_k) ctx.accumulate(1, std::move(dk));
    if (need_v) ctx.accumulate(2, std::move(dv));
  });
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, std::size_t n_heads,
                                    std::size_t n_kv_heads, double scale, bool causal, const MaskArray& allowed) {
  check_inputs(op_name, {&q, &k, &v});
  const Shape sq = q.shape(), sk = k.shape(), sv = v.shape();
  const auto shapes = [&] { return fmt::format("q {}, k {}, v {}", to_string(sq), to_string(sk), to_string(sv)); };
  if (sq.size() != 3 || sk.size() != 3 || sv.size() != 3)
    fail(op_name, "{}: each must be (B, T, heads·d)", shapes());
  if (n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0)
    fail(op_name, "{} heads and {} kv heads: need n_heads a positive multiple of n_kv_heads", n_heads, n_kv_heads);
  if (sq[2] % n_heads != 0 || sk[2] % n_kv_heads != 0 || sv[2] % n_kv_heads != 0)
    fail(op_name, "{}: the last dimensions must split into {} query heads and {} kv heads", shapes(), n_heads, n_kv_heads);
  Layout L{sq[0], sq[1], sk[1], n_heads, n_kv_heads, n_heads / n_kv_heads, sq[2] / n_heads, sv[2] / n_kv_heads,
           causal, nullptr};
  if (sk[2] / n_kv_heads != L.dh)
    fail(op_name, "{}: queries have {} features per head and keys {}", shapes(), L.dh, sk[2] / n_kv_heads);
  if (sk[0] != L.B || sv[0] != L.B || sv[1] != L.Tk)
    fail(op_name, "{}: need one batch size, and keys and values of one length", shapes());
  if (causal && L.Tq > L.Tk)
    fail(op_name, "{}: a causal mask needs at least as many keys as queries", shapes());
  if (!std::isfinite(scale)) fail(op_name, "scale must be finite, got {}", scale);
  if (allowed.dimension() > 0) {
    const Shape want{L.B, L.H, L.Tq, L.Tk};
    if (to_shape(allowed.shape()) != want)
      fail(op_name, "mask of shape {} must be (B, H, Tq, Tk) = {}", to_string(to_shape(allowed.shape())),
           to_string(want));
    L.allowed = allowed.data();
  }
  return dispatch(q.dtype(), [&](auto t) {
    using T = decltype(t);
    return attention<T>(q, k, v, L, T(scale));
  });
}

}  // namespace qkv
