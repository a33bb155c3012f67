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
#include <type_traits>
#include <vector>

#include "core/detail/blas.hpp"
#include "core/detail/kernels.hpp"
#include "core/detail/op.hpp"
#include "core/ops.hpp"

namespace qkv {

namespace {

constexpr const char* op_name = "scaled_dot_product_attention";

struct Layout {
  std::size_t B, Tq, Tk, H, Hkv, dh, dv;
  bool causal;
  const bool* allowed;  // (B, H, Tq, Tk) or null
  std::size_t G() const { return H / Hkv; }  // query heads per kv head
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
    if constexpr (std::is_same_v<T, float>) {
      if (!ok) {  // the common case, vectorised over whole rows: hidden keys score -inf, weigh 0
        std::fill(row + n, row + L.Tk, -std::numeric_limits<float>::infinity());
        const float m = detail::max_of(row, L.Tk);
        if (m == -std::numeric_limits<float>::infinity()) {
          std::fill(row, row + L.Tk, 0.0f);
          continue;
        }
        detail::scale_by(row, L.Tk, 1.0f / detail::exp_shifted_sum(row, L.Tk, m));
        continue;
      }
    }
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

// dS = P ⊙ (dP − rowsum(P ⊙ dP)) in place of dP, over each row's keys up to the causal limit;
// zero beyond it. Masked keys have P = 0, so their dS is 0.
template <class T>
void softmax_backward_rows(const T* P, T* dS, const Layout& L) {
  for (std::size_t i = 0; i < L.Tq; ++i) {
    const T* p = P + i * L.Tk;
    T* d = dS + i * L.Tk;
    if constexpr (std::is_same_v<T, float>) {
      detail::softmax_backward_row(p, d, L.Tk);  // p is 0 past the limit, so d becomes 0 there
      continue;
    }
    const std::size_t n = L.limit(i);
    T c = 0;
    for (std::size_t j = 0; j < n; ++j) c += p[j] * d[j];
    for (std::size_t j = 0; j < n; ++j) d[j] = p[j] * (d[j] - c);
    std::fill(d + n, d + L.Tk, T(0));
  }
}

// A per-thread scratch matrix, reused across calls.
template <class T>
T* scratch(std::size_t n) {
  thread_local std::vector<T> buffer;
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

// Where q, k or v sits: input `tensor` of the op, rows of `ld` elements, the first head at `col`.
struct Operand {
  std::size_t tensor, ld, col;
};

template <class T>
Tensor attention(const std::vector<Tensor>& in, const Operand (&op)[3], Layout L, T scale) {
  bool any_grad = false;
  for (const Tensor& t : in) any_grad = any_grad || t.requires_grad();
  const bool record = is_grad_enabled() && any_grad;
  const Operand oq = op[0], ok = op[1], ov = op[2];
  const std::size_t ldo = L.H * L.dv;
  Array<T> out = Array<T>::from_shape({L.B, L.Tq, ldo});
  // The weights of every head when backward needs them; otherwise one scratch matrix per thread.
  auto weights = std::make_shared<Array<T>>();
  if (record) *weights = Array<T>::from_shape({L.B, L.H, L.Tq, L.Tk});
  const T* Q = in[oq.tensor].value<T>().data() + oq.col;
  const T* K = in[ok.tensor].value<T>().data() + ok.col;
  const T* V = in[ov.tensor].value<T>().data() + ov.col;
  T* O = out.data();
  detail::parallel_for(L.B * L.Hkv, [&](std::size_t task) {
    const std::size_t b = task / L.Hkv, kv = task % L.Hkv;
    const T* Kb = K + b * L.Tk * ok.ld + kv * L.dh;
    const T* Vb = V + b * L.Tk * ov.ld + kv * L.dv;
    for (std::size_t h = kv * L.G(); h < (kv + 1) * L.G(); ++h) {
      T* P = record ? weights->data() + (b * L.H + h) * L.Tq * L.Tk : scratch<T>(L.Tq * L.Tk);
      detail::gemm(false, true, L.Tq, L.Tk, L.dh, scale, Q + b * L.Tq * oq.ld + h * L.dh, oq.ld, Kb, ok.ld, T(0), P, L.Tk);
      softmax_rows(P, L, b, h);
      detail::gemm(false, false, L.Tq, L.dv, L.Tk, T(1), P, L.Tk, Vb, ov.ld, T(0), O + b * L.Tq * ldo + h * L.dv, ldo);
    }
  });
  if (!record) return Tensor(std::move(out));
  L.allowed = nullptr;  // backward needs no mask: a masked weight is exactly 0, so is its dS
  std::vector<const Tensor*> inputs;
  for (const Tensor& t : in) inputs.push_back(&t);
  return record_op<T>(op_name, std::move(out), inputs, [in, oq, ok, ov, L, scale, weights](BackwardContext<T>& ctx) {
    const std::size_t ldo = L.H * L.dv;
    const T* Q = in[oq.tensor].value<T>().data() + oq.col;
    const T* K = in[ok.tensor].value<T>().data() + ok.col;
    const T* V = in[ov.tensor].value<T>().data() + ov.col;
    const T* dO = ctx.grad().data();
    // One gradient per input; every element is written (beta 0 for a kv head's first query
    // head), since q, k and v together cover each input.
    std::vector<Array<T>> grads(in.size());
    for (std::size_t i = 0; i < in.size(); ++i)
      if (ctx.needs(i)) grads[i] = Array<T>::from_shape(in[i].shape());
    const auto target = [&](const Operand& o) { return ctx.needs(o.tensor) ? grads[o.tensor].data() + o.col : nullptr; };
    T* dQ = target(oq);
    T* dK = target(ok);
    T* dV = target(ov);
    detail::parallel_for(L.B * L.Hkv, [&](std::size_t task) {
      const std::size_t b = task / L.Hkv, kv = task % L.Hkv;
      const std::size_t k_off = b * L.Tk * ok.ld + kv * L.dh, v_off = b * L.Tk * ov.ld + kv * L.dv;
      T* dS = scratch<T>(L.Tq * L.Tk);
      for (std::size_t h = kv * L.G(); h < (kv + 1) * L.G(); ++h) {
        const T beta = h == kv * L.G() ? T(0) : T(1);
        const T* P = weights->data() + (b * L.H + h) * L.Tq * L.Tk;
        const T* dOh = dO + b * L.Tq * ldo + h * L.dv;
        const std::size_t q_off = b * L.Tq * oq.ld + h * L.dh;
        if (dV) detail::gemm(true, false, L.Tk, L.dv, L.Tq, T(1), P, L.Tk, dOh, ldo, beta, dV + v_off, ov.ld);
        if (!dQ && !dK) continue;
        detail::gemm(false, true, L.Tq, L.Tk, L.dv, T(1), dOh, ldo, V + v_off, ov.ld, T(0), dS, L.Tk);
        softmax_backward_rows(P, dS, L);
        if (dQ) detail::gemm(false, false, L.Tq, L.dh, L.Tk, scale, dS, L.Tk, K + k_off, ok.ld, T(0), dQ + q_off, oq.ld);
        if (dK) detail::gemm(true, false, L.Tk, L.dh, L.Tq, scale, dS, L.Tk, Q + q_off, oq.ld, beta, dK + k_off, ok.ld);
      }
    });
    for (std::size_t i = 0; i < in.size(); ++i)
      if (ctx.needs(i)) ctx.accumulate(i, std::move(grads[i]));
  });
}

// Checks the mask and the dtype, then runs attention.
Tensor run(const std::vector<Tensor>& in, const Operand (&op)[3], Layout L, double scale, const MaskArray& allowed) {
  if (L.causal && L.Tq > L.Tk)
    fail(op_name, "{} queries and {} keys: a causal mask needs at least as many keys as queries", L.Tq, L.Tk);
  if (!std::isfinite(scale)) fail(op_name, "scale must be finite, got {}", scale);
  if (allowed.dimension() > 0) {
    const Shape want{L.B, L.H, L.Tq, L.Tk};
    if (to_shape(allowed.shape()) != want)
      fail(op_name, "mask of shape {} must be (B, H, Tq, Tk) = {}", to_string(to_shape(allowed.shape())),
           to_string(want));
    L.allowed = allowed.data();
  }
  return dispatch(in[0].dtype(), [&](auto t) {
    using T = decltype(t);
    return attention<T>(in, op, L, T(scale));
  });
}

void check_heads(std::size_t n_heads, std::size_t n_kv_heads) {
  if (n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0)
    fail(op_name, "{} heads and {} kv heads: need n_heads a positive multiple of n_kv_heads", n_heads, n_kv_heads);
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, std::size_t n_heads,
                                    std::size_t n_kv_heads, double scale, bool causal, const MaskArray& allowed) {
  check_inputs(op_name, {&q, &k, &v});
  const Shape sq = q.shape(), sk = k.shape(), sv = v.shape();
  const auto shapes = [&] { return fmt::format("q {}, k {}, v {}", to_string(sq), to_string(sk), to_string(sv)); };
  if (sq.size() != 3 || sk.size() != 3 || sv.size() != 3)
    fail(op_name, "{}: each must be (B, T, heads·d)", shapes());
  check_heads(n_heads, n_kv_heads);
  if (sq[2] % n_heads != 0 || sk[2] % n_kv_heads != 0 || sv[2] % n_kv_heads != 0)
    fail(op_name, "{}: the last dimensions must split into {} query heads and {} kv heads", shapes(), n_heads, n_kv_heads);
  const Layout L{sq[0], sq[1], sk[1], n_heads, n_kv_heads, sq[2] / n_heads, sv[2] / n_kv_heads,
                 causal, nullptr};
  if (sk[2] / n_kv_heads != L.dh)
    fail(op_name, "{}: queries have {} features per head and keys {}", shapes(), L.dh, sk[2] / n_kv_heads);
  if (sk[0] != L.B || sv[0] != L.B || sv[1] != L.Tk)
    fail(op_name, "{}: need one batch size, and keys and values of one length", shapes());
  const Operand op[3] = {{0, sq[2], 0}, {1, sk[2], 0}, {2, sv[2], 0}};
  return run({q, k, v}, op, L, scale, allowed);
}

Tensor scaled_dot_product_attention(const Tensor& qkv, std::size_t n_heads, std::size_t n_kv_heads, std::size_t d_head,
                                    std::size_t d_v, double scale, bool causal, const MaskArray& allowed) {
  check_inputs(op_name, {&qkv});
  check_heads(n_heads, n_kv_heads);
  const Shape s = qkv.shape();
  const std::size_t width = n_heads * d_head + n_kv_heads * (d_head + d_v);
  if (s.size() != 3 || s[2] != width || d_head == 0 || d_v == 0)
    fail(op_name, "packed qkv of shape {} must be (B, T, H·d_head + Hkv·(d_head + d_v)) = (B, T, {}·{} + {}·({} + {}))",
         to_string(s), n_heads, d_head, n_kv_heads, d_head, d_v);
  const Layout L{s[0], s[1], s[1], n_heads, n_kv_heads, d_head, d_v, causal, nullptr};
  const Operand op[3] = {{0, width, 0}, {0, width, n_heads * d_head}, {0, width, (n_heads + n_kv_heads) * d_head}};
  return run({qkv}, op, L, scale, allowed);
}

}  // namespace qkv
