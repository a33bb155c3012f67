// scaled_dot_product_attention: every head of a batch at once, heads packed in the last dimension.
// Per batch entry b and head h, with Q, K, V the head's (rows × d) slices read in place:
//   Sᵀ = K Qᵀ,  Pᵀ = softmax of scale · Sᵀ down each query's column of visible keys,  O = P V.
// Backward, from dO:
//   dV = Pᵀ dO,  dPᵀ = V dOᵀ,  dSᵀ = scale · Pᵀ ⊙ (dPᵀ − colsum(Pᵀ ⊙ dPᵀ)),  dQ = dS K,  dK = dSᵀ Q.
// Scores are transposed so that the softmax runs 16 queries side by side (core/kernels.cpp). The
// per-head products are small (a few thousand to a million multiply-adds) and run as kernels
// libxsmm generated for their sizes (detail::SmallGemm); Qᵀ and dOᵀ are copied per head so that
// every product is of the kinds it generates. It keeps Pᵀ for backward and nothing else. Work is
// split across threads by (b, kv head); the G = H / Hkv query heads that share a kv head run in
// order on one thread, since their dK and dV add up.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "qkv/core/detail/attention.hpp"
#include "qkv/core/detail/blas.hpp"
#include "qkv/core/detail/kernels.hpp"
#include "qkv/core/detail/op.hpp"
#include "qkv/core/ops.hpp"
#include "qkv/core/runtime.hpp"

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

// Scores are kept transposed, Sᵀ with one row per key and one column per query, so that the
// softmax over a query's keys runs down a column, 16 queries side by side. Rows are padded to
// whole blocks of 16 columns.
std::size_t padded(std::size_t n) { return (n + detail::softmax_lanes - 1) / detail::softmax_lanes * detail::softmax_lanes; }

// The causal limits of queries [i0, i0 + 16); 0 for the padding past Tq.
void limits_of(const Layout& L, std::size_t i0, std::int32_t* limits) {
  for (std::size_t c = 0; c < detail::softmax_lanes; ++c)
    limits[c] = i0 + c < L.Tq ? std::int32_t(L.limit(i0 + c)) : 0;
}

// Raw scores Sᵀ = K Qᵀ (Tk rows of ld) become weights Pᵀ in place: each query's column the
// softmax of scale · its scores over the keys it may see, exactly zero elsewhere, and all zero
// when it sees nothing. An arbitrary mask makes its hidden scores −inf first (scaled before, so
// that no scale multiplies an infinity).
template <class T>
void softmax_columns(T* S, std::size_t ld, const Layout& L, std::size_t b, std::size_t h, T scale) {
  if (ld == 1) {  // one query, unpadded: its scores are one contiguous vector
    if (L.allowed) {
      const bool* ok = L.allowed_row(b, h, 0);
      for (std::size_t j = 0; j < L.limit(0); ++j) S[j] = ok[j] ? S[j] * scale : -std::numeric_limits<T>::infinity();
      scale = 1;
    }
    return detail::softmax_row(S, L.Tk, L.limit(0), scale);
  }
  if (L.allowed) {
    for (std::size_t i = 0; i < L.Tq; ++i) {
      const bool* ok = L.allowed_row(b, h, i);
      for (std::size_t j = 0; j < L.limit(i); ++j)
        S[j * ld + i] = ok[j] ? S[j * ld + i] * scale : -std::numeric_limits<T>::infinity();
    }
    scale = 1;
  }
  std::int32_t limits[detail::softmax_lanes];
  for (std::size_t i0 = 0; i0 < L.Tq; i0 += detail::softmax_lanes) {
    limits_of(L, i0, limits);
    detail::softmax_columns(S + i0, ld, L.Tk, limits, scale);
  }
}

// dSᵀ = scale · Pᵀ ⊙ (dPᵀ − colsum(Pᵀ ⊙ dPᵀ)) in place of dPᵀ, over each query's keys up to the
// causal limit; zero beyond it. Masked keys have P = 0, so their dS is 0.
template <class T>
void softmax_backward_columns(const T* P, T* dS, std::size_t ld, const Layout& L, T scale) {
  std::int32_t limits[detail::softmax_lanes];
  for (std::size_t i0 = 0; i0 < L.Tq; i0 += detail::softmax_lanes) {
    limits_of(L, i0, limits);
    detail::softmax_backward_columns(P + i0, dS + i0, ld, L.Tk, limits, scale);
  }
}

// Per-thread scratch, reused across calls.
template <class T>
T* scratch(std::size_t n) {
  thread_local std::vector<T> buffer;
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

// Runs f(b, kv) for every batch entry and kv head, in contiguous runs across the pool's threads:
// the heads of one batch entry write neighbouring columns of the same rows, and interleaving them
// between threads would make the threads share cache lines.
template <class F>
void for_each_head(const Layout& L, F&& f) {
  const std::size_t n = L.B * L.Hkv, runs = std::min(n, 16 * get_num_threads());
  detail::parallel_ranges(n, (n + runs - 1) / std::max<std::size_t>(runs, 1), [&](std::size_t lo, std::size_t hi) {
    for (std::size_t t = lo; t < hi; ++t) f(t / L.Hkv, t % L.Hkv);
  });
}

// Where q, k or v sits: input `tensor` of the op, rows of `ld` elements, the first head at `col`,
// batch entries `rows` rows apart (0: as many as the sequence has, Tq or Tk).
struct Operand {
  std::size_t tensor, ld, col, rows = 0;
};

template <class T>
Tensor attention(const std::vector<Tensor>& in, const Operand (&op)[3], Layout L, T scale) {
  using Product = detail::SmallGemm<T>;
  bool any_grad = false;
  for (const Tensor& t : in) any_grad = any_grad || t.requires_grad();
  const bool record = is_grad_enabled() && any_grad;
  const Operand oq = op[0], ok = op[1], ov = op[2];
  // A single query outside autograd (decoding) keeps its scores unpadded, for the row softmax.
  const std::size_t ldo = L.H * L.dv, ldq = !record && L.Tq == 1 ? 1 : padded(L.Tq);
  // Elements between batch entries.
  const std::size_t bq = (oq.rows ? oq.rows : L.Tq) * oq.ld, bk = (ok.rows ? ok.rows : L.Tk) * ok.ld,
                    bv = (ov.rows ? ov.rows : L.Tk) * ov.ld;
  Array<T> out = Array<T>::from_shape({L.B, L.Tq, ldo});
  // The weights Pᵀ of every head when backward needs them; otherwise one scratch matrix per thread.
  auto weights = std::make_shared<Array<T>>();
  if (record) *weights = Array<T>::from_shape({L.B, L.H, L.Tk, ldq});
  const T* Q = in[oq.tensor].value<T>().data() + oq.col;
  const T* K = in[ok.tensor].value<T>().data() + ok.col;
  const T* V = in[ov.tensor].value<T>().data() + ov.col;
  T* O = out.data();
  const Product scores(false, L.Tk, L.Tq, L.dh, ok.ld, L.Tq, ldq, false);  // Sᵀ = K · (Qᵀ copied)
  const Product mix(true, L.Tq, L.dv, L.Tk, ldq, ov.ld, ldo, false);      // O = (Pᵀ)ᵀ V
  for_each_head(L, [&](std::size_t b, std::size_t kv) {
    T* Qt = scratch<T>(L.dh * L.Tq + (record ? 0 : L.Tk * ldq));
    const T* Kb = K + b * bk + kv * L.dh;
    const T* Vb = V + b * bv + kv * L.dv;
    for (std::size_t h = kv * L.G(); h < (kv + 1) * L.G(); ++h) {
      T* P = record ? weights->data() + (b * L.H + h) * L.Tk * ldq : Qt + L.dh * L.Tq;
      detail::transpose(Q + b * bq + h * L.dh, L.Tq, L.dh, oq.ld, Qt);
      scores(Kb, Qt, P);
      softmax_columns(P, ldq, L, b, h, scale);
      mix(P, Vb, O + b * L.Tq * ldo + h * L.dv);
    }
  });
  if (!record) return Tensor(std::move(out));
  L.allowed = nullptr;  // backward needs no mask: a masked weight is exactly 0, so is its dS
  std::vector<const Tensor*> inputs;
  for (const Tensor& t : in) inputs.push_back(&t);
  return record_op<T>(op_name, std::move(out), inputs, [in, oq, ok, ov, L, scale, weights](BackwardContext<T>& ctx) {
    const std::size_t ldo = L.H * L.dv, ldq = padded(L.Tq);
    const T* Q = in[oq.tensor].value<T>().data() + oq.col;
    const T* K = in[ok.tensor].value<T>().data() + ok.col;
    const T* V = in[ov.tensor].value<T>().data() + ov.col;
    const T* dO = ctx.grad().data();
    // One gradient per input; every element is written (the first query head of a kv head sets
    // dK and dV, the others add), since q, k and v together cover each input.
    std::vector<Array<T>> grads(in.size());
    for (std::size_t i = 0; i < in.size(); ++i)
      if (ctx.needs(i)) grads[i] = Array<T>::from_shape(in[i].shape());
    const auto target = [&](const Operand& o) { return ctx.needs(o.tensor) ? grads[o.tensor].data() + o.col : nullptr; };
    T* dQ = target(oq);
    T* dK = target(ok);
    T* dV = target(ov);
    // dV = Pᵀ dO, dPᵀ = V · (dOᵀ copied), dQ = (dSᵀ)ᵀ K, dK = dSᵀ Q; of each pair, the second adds.
    const Product dv_set(false, L.Tk, L.dv, L.Tq, ldq, ldo, ov.ld, false), dv_add(false, L.Tk, L.dv, L.Tq, ldq, ldo, ov.ld, true);
    const Product dp(false, L.Tk, L.Tq, L.dv, ov.ld, L.Tq, ldq, false);
    const Product dq(true, L.Tq, L.dh, L.Tk, ldq, ok.ld, oq.ld, false);
    const Product dk_set(false, L.Tk, L.dh, L.Tq, ldq, oq.ld, ok.ld, false), dk_add(false, L.Tk, L.dh, L.Tq, ldq, oq.ld, ok.ld, true);
    for_each_head(L, [&](std::size_t b, std::size_t kv) {
      const std::size_t k_off = b * L.Tk * ok.ld + kv * L.dh, v_off = b * L.Tk * ov.ld + kv * L.dv;
      T* dS = scratch<T>(L.Tk * ldq + L.dv * L.Tq);
      T* dOt = dS + L.Tk * ldq;
      for (std::size_t h = kv * L.G(); h < (kv + 1) * L.G(); ++h) {
        const bool first = h == kv * L.G();
        const T* P = weights->data() + (b * L.H + h) * L.Tk * ldq;
        const T* dOh = dO + b * L.Tq * ldo + h * L.dv;
        const std::size_t q_off = b * L.Tq * oq.ld + h * L.dh;
        if (dV) (first ? dv_set : dv_add)(P, dOh, dV + v_off);
        if (!dQ && !dK) continue;
        detail::transpose(dOh, L.Tq, L.dv, ldo, dOt);
        dp(V + v_off, dOt, dS);
        softmax_backward_columns(P, dS, ldq, L, scale);
        if (dQ) dq(dS, K + k_off, dQ + q_off);
        if (dK) (first ? dk_set : dk_add)(dS, Q + q_off, dK + k_off);
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

Tensor detail::cached_attention(const Tensor& q, const Tensor& keys, const Tensor& values,
                                std::size_t length, std::size_t n_heads, std::size_t n_kv_heads, double scale, bool causal,
                                const MaskArray& allowed) {
  check_inputs(op_name, {&q, &keys, &values});
  if (is_grad_enabled() && (q.requires_grad() || keys.requires_grad() || values.requires_grad()))
    fail(op_name, "attention against a KV cache is forward only");
  check_heads(n_heads, n_kv_heads);
  const Shape sq = q.shape(), sk = keys.shape(), sv = values.shape();
  if (sq.size() != 3 || sk.size() != 3 || sv.size() != 3 || sk[0] != sq[0] || sv[0] != sq[0] || sv[1] != sk[1] ||
      length > sk[1] || sk[2] % n_kv_heads != 0 || sv[2] % n_kv_heads != 0 || sq[2] != n_heads * (sk[2] / n_kv_heads))
    fail(op_name, "queries {} against {} cached keys of {} and values of {}: they do not fit", to_string(sq), length,
         to_string(sk), to_string(sv));
  const Layout L{sq[0], sq[1], length, n_heads, n_kv_heads, sk[2] / n_kv_heads, sv[2] / n_kv_heads, causal, nullptr};
  const Operand op[3] = {{0, sq[2], 0, 0}, {1, sk[2], 0, sk[1]}, {2, sv[2], 0, sv[1]}};
  return run({q, keys, values}, op, L, scale, allowed);
}

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
