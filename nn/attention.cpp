#include "qkv/nn/attention.hpp"

#include <cmath>
#include <limits>

#include <xtensor/xbuilder.hpp>
#include <xtensor/xoperation.hpp>
#include <xtensor/xstrided_view.hpp>

#include "qkv/core/autograd.hpp"
#include "qkv/core/detail/attention.hpp"
#include "qkv/core/detail/op.hpp"
#include "qkv/core/ops.hpp"

namespace qkv::nn {

namespace {

constexpr const char* who = "MultiHeadAttention";

MultiHeadAttentionOptions resolve(MultiHeadAttentionOptions o) {
  if (o.d_model == 0) fail(who, "d_model must be positive");
  if (o.n_heads == 0) fail(who, "n_heads must be positive");
  if (o.d_head == 0) {
    if (o.d_model % o.n_heads != 0)
      fail(who, "d_model {} is not divisible by n_heads {}: give d_head", o.d_model, o.n_heads);
    o.d_head = o.d_model / o.n_heads;
  }
  if (o.n_kv_heads == 0) o.n_kv_heads = o.n_heads;
  if (o.n_heads % o.n_kv_heads != 0)
    fail(who, "n_heads {} is not a multiple of n_kv_heads {}", o.n_heads, o.n_kv_heads);
  if (o.d_v == 0) o.d_v = o.d_head;
  if (o.kdim == 0) o.kdim = o.d_model;
  if (o.vdim == 0) o.vdim = o.d_model;
  if (o.scale && !std::isfinite(*o.scale)) fail(who, "scale must be finite, got {}", *o.scale);
  if (o.qk != QK::untied && (o.n_kv_heads != o.n_heads || o.kdim != o.d_model))
    fail(who, "qk={} needs n_kv_heads = n_heads and kdim = d_model (got n_kv_heads {}, n_heads {}, kdim {}, d_model {})",
         o.qk == QK::tied ? "tied" : "symmetric", o.n_kv_heads, o.n_heads, o.kdim, o.d_model);
  if (o.qk == QK::symmetric && o.d_head < 2)
    fail(who, "qk=symmetric needs d_head of at least 2 (one +1 and one −1 sign), got {}", o.d_head);
  if (o.proj == Projection::identity || o.proj == Projection::identity_qk) {
    const char* proj = o.proj == Projection::identity ? "identity" : "identity-qk";
    if (o.d_head * o.n_heads != o.d_model)
      fail(who, "proj={} needs d_head·n_heads = d_model, got {}·{} = {} and d_model {}", proj, o.d_head, o.n_heads,
           o.d_head * o.n_heads, o.d_model);
    if (o.n_kv_heads != o.n_heads || o.kdim != o.d_model)
      fail(who, "proj={} needs n_kv_heads = n_heads and kdim = d_model (got n_kv_heads {}, kdim {})", proj, o.n_kv_heads,
           o.kdim);
    if (o.proj == Projection::identity && (o.d_v != o.d_head || o.vdim != o.d_model))
      fail(who, "proj=identity needs d_v = d_head and vdim = d_model (got d_v {}, vdim {})", o.d_v, o.vdim);
  }
  return o;
}

// An input must be (B, T, width), or (T, width) unbatched.
void check_input(const char* name, const Tensor& t, std::size_t width) {
  const Shape s = t.shape();
  if ((s.size() != 2 && s.size() != 3) || s.back() != width)
    fail(who, "{} of shape {} must be (B, T, {}) or (T, {})", name, to_string(s), width, width);
}

Tensor batched(const Tensor& t) {
  return t.dim() == 3 ? t : reshape(t, {1, std::int64_t(t.size(0)), std::int64_t(t.size(1))});
}

Tensor unbatched(const Tensor& t) {
  if (!t.defined()) return t;
  Shape s = t.shape();
  return reshape(t, std::vector<std::int64_t>(s.begin() + 1, s.end()));
}

// Which keys each query may attend: (B, H, Tq, Tk), true = may attend. Empty when nothing is masked.
MaskArray allowed_keys(const AttentionMask& mask, std::size_t B, std::size_t H, std::size_t Tq, std::size_t Tk) {
  const bool padding = mask.key_padding.dimension() > 0, allowed = mask.allowed.dimension() > 0;
  if (!mask.causal && !padding && !allowed) return MaskArray();
  const Shape full{B, H, Tq, Tk};
  MaskArray ok = xt::ones<bool>(full);
  if (mask.causal) {
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t i = 0; i < Tq; ++i)
          for (std::size_t j = 0; j < Tk; ++j)
            if (std::int64_t(j) > std::int64_t(Tk) - std::int64_t(Tq) + std::int64_t(i)) ok(b, h, i, j) = false;
  }
  if (padding) {
    if (to_shape(mask.key_padding.shape()) != Shape{B, Tk})
      fail(who, "key_padding mask of shape {} must be (B, Tk) = ({},{})", to_string(to_shape(mask.key_padding.shape())),
           B, Tk);
    ok = ok && xt::broadcast(xt::reshape_view(mask.key_padding, Shape{B, 1, 1, Tk}), full);
  }
  if (allowed) {
    const Shape sa = to_shape(mask.allowed.shape());
    if (try_broadcast_shapes(sa, full) != full)
      fail(who, "mask of shape {} does not broadcast to (B, H, Tq, Tk) = {}", to_string(sa), to_string(full));
    ok = ok && xt::broadcast(mask.allowed, full);
  }
  return ok;
}

// The fused op's masks: a plain causal mask as a flag, anything else as a full (B, H, Tq, Tk)
// array of allowed keys.
struct FusedMask {
  bool causal;
  MaskArray allowed;
};
FusedMask fused_mask(const AttentionMask& mask, std::size_t B, std::size_t H, std::size_t Tq, std::size_t Tk) {
  const bool masks = mask.key_padding.dimension() > 0 || mask.allowed.dimension() > 0;
  if (!masks) return {mask.causal, MaskArray()};
  return {false, allowed_keys(mask, B, H, Tq, Tk)};
}

// Rows [row0, row0 + rows) of a (out, in) weight, transposed: (in, rows). A copy.
Tensor rows_transposed(const Tensor& weight, std::size_t row0, std::size_t rows) {
  NoGradGuard no_grad;
  return transpose(slice(weight, 0, std::int64_t(row0), std::int64_t(row0 + rows)), 0, 1).detach();
}

// Columns [col0, col0 + cols) of the d × d identity: what an identity head reads.
Tensor identity_columns(std::size_t d, std::size_t col0, std::size_t cols, DType dtype) {
  Array<double> eye = xt::zeros<double>(Shape{d, cols});
  for (std::size_t c = 0; c < cols; ++c) eye(col0 + c, c) = 1;
  return Tensor(std::move(eye)).to(dtype);
}

}  // namespace

std::size_t KVCache::bytes() const {
  if (!buffers_) return 0;
  const Tensor& k = buffers_->keys;
  return k.size(0) * length_ * (k.size(2) + buffers_->values.size(2)) * dtype_size(k.dtype());
}

std::size_t KVCache::bytes_per_sequence() const {
  return buffers_ && buffers_->keys.size(0) > 0 ? bytes() / buffers_->keys.size(0) : 0;
}

std::size_t KVCache::capacity_bytes() const {
  return buffers_ ? (buffers_->keys.numel() + buffers_->values.numel()) * dtype_size(buffers_->keys.dtype()) : 0;
}

Tensor KVCache::keys() const { return buffers_ ? slice(buffers_->keys, 1, 0, std::int64_t(length_)) : Tensor(); }

Tensor KVCache::values() const { return buffers_ ? slice(buffers_->values, 1, 0, std::int64_t(length_)) : Tensor(); }

const Tensor& KVCache::key_buffer() const {
  if (!buffers_) fail("KVCache", "the cache is empty");
  return buffers_->keys;
}

const Tensor& KVCache::value_buffer() const {
  if (!buffers_) fail("KVCache", "the cache is empty");
  return buffers_->values;
}

void KVCache::append(const Tensor& k, const Tensor& v) {
  if (!k.defined() || !v.defined() || k.dim() != 3 || v.dim() != 3)
    fail("KVCache", "append takes keys and values (B, T_new, ·)");
  const std::size_t k_width = k.size(2), v_width = v.size(2);
  const std::size_t B = k.size(0), n = k.size(1), need = length_ + n;
  if (v.size(0) != B || v.size(1) != n || k.dtype() != v.dtype())
    fail("KVCache", "keys {} and values {} of different sequences, positions or dtypes", to_string(k.shape()),
         to_string(v.shape()));
  if (buffers_) {
    const Tensor& bk = buffers_->keys;
    if (bk.size(0) != B || bk.size(2) != k_width || buffers_->values.size(2) != v_width || bk.dtype() != k.dtype())
      fail("KVCache", "the cache holds keys of shape (B, T, ·) = ({},{},{}) and values of width {} in {}; this call "
           "appends ({},{},{}) and {} in {}",
           bk.size(0), length_, bk.size(2), buffers_->values.size(2), dtype_name(bk.dtype()), B, n, k_width, v_width,
           dtype_name(k.dtype()));
  }
  detail::dispatch(k.dtype(), [&](auto tag) {
    using T = decltype(tag);
    // In place when this copy wrote last and there is room; otherwise new buffers holding this
    // copy's positions: as many rows as needed at first (a prompt, or a memory that never grows),
    // then twice the old room, so that one row a step copies the past only log₂ T times.
    if (!buffers_ || buffers_->used != length_ || need > buffers_->keys.size(1)) {
      const std::size_t capacity = buffers_ ? std::max(need, 2 * buffers_->keys.size(1)) : need;
      auto fresh = std::make_shared<Buffers>();
      Array<T> keys = Array<T>::from_shape({B, capacity, k_width}), values = Array<T>::from_shape({B, capacity, v_width});
      if (buffers_) {
        const T* ok = buffers_->keys.value<T>().data();
        const T* ov = buffers_->values.value<T>().data();
        const std::size_t old = buffers_->keys.size(1);
        for (std::size_t b = 0; b < B; ++b) {
          std::copy_n(ok + b * old * k_width, length_ * k_width, keys.data() + b * capacity * k_width);
          std::copy_n(ov + b * old * v_width, length_ * v_width, values.data() + b * capacity * v_width);
        }
      }
      fresh->keys = Tensor(std::move(keys));
      fresh->values = Tensor(std::move(values));
      buffers_ = std::move(fresh);
    }
    const std::size_t capacity = buffers_->keys.size(1);
    T* dk = buffers_->keys.mutable_value<T>().data();
    T* dv = buffers_->values.mutable_value<T>().data();
    const T* sk = k.value<T>().data();
    const T* sv = v.value<T>().data();
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t t = 0; t < n; ++t) {
        std::copy_n(sk + (b * n + t) * k_width, k_width, dk + (b * capacity + length_ + t) * k_width);
        std::copy_n(sv + (b * n + t) * v_width, v_width, dv + (b * capacity + length_ + t) * v_width);
      }
  });
  buffers_->used = length_ = need;
}

MultiHeadAttention::MultiHeadAttention(const MultiHeadAttentionOptions& options, Generator& gen)
    : options_(resolve(options)) {
  const auto& o = options_;
  // Drawn in the order q, k, v: identity has none of them, identity-qk only v.
  if (o.proj != Projection::identity && o.proj != Projection::identity_qk) {
    q_proj = std::make_unique<Linear>(o.d_model, o.n_heads * o.d_head, o.qkv_bias, o.dtype, gen);
    if (o.qk == QK::untied) k_proj = std::make_unique<Linear>(o.kdim, o.n_kv_heads * o.d_head, o.qkv_bias, o.dtype, gen);
  }
  if (o.proj != Projection::identity) v_proj = std::make_unique<Linear>(o.vdim, o.n_kv_heads * o.d_v, o.qkv_bias, o.dtype, gen);
  for (const auto& [name, p] : {std::pair{"q_proj", q_proj.get()}, {"k_proj", k_proj.get()}, {"v_proj", v_proj.get()}})
    if (p) {
      register_module(name, *p);
      if (o.proj == Projection::frozen)
        for (Tensor& t : p->parameters()) t.requires_grad_(false);
    }
  out_proj = std::make_unique<Linear>(o.n_heads * o.d_v, o.d_model, o.out_bias, o.dtype, gen);
  register_module("out_proj", *out_proj);
  register_hook("hook_q", hook_q);
  register_hook("hook_k", hook_k);
  register_hook("hook_v", hook_v);
  register_hook("hook_attn_scores", hook_attn_scores);
  register_hook("hook_pattern", hook_pattern);
  register_hook("hook_z", hook_z);
  if (o.qk == QK::symmetric) {  // constants, made once in each dtype (Module::to converts only parameters)
    Array<double> s = Array<double>::from_shape({o.n_heads * o.d_head});
    for (std::size_t i = 0; i < s.size(); ++i) s(i) = i % o.d_head < (o.d_head + 1) / 2 ? 1.0 : -1.0;
    signs64_ = Tensor(std::move(s));
    signs32_ = signs64_.to(DType::float32);
  }
}

double MultiHeadAttention::scale() const { return options_.scale.value_or(1.0 / std::sqrt(double(options_.d_head))); }

std::size_t MultiHeadAttention::kv_head_of(std::size_t h) const {
  if (h >= options_.n_heads) fail(who, "head {} out of range for n_heads {}", h, options_.n_heads);
  return h / (options_.n_heads / options_.n_kv_heads);
}

AttentionResult MultiHeadAttention::forward(const Tensor& x, const AttentionMask& mask, bool need_weights,
                                            KVCache* cache) const {
  const auto& o = options_;
  check_input("input x", x, o.d_model);
  const Tensor xb = batched(x);
  const bool symmetric = o.qk == QK::symmetric;
  // Decoding: new positions against a cache, without weights, hooks or gradients, in the fused kernel.
  const bool decoding = cache != nullptr && !need_weights && !hooked() && !is_grad_enabled();
  if (!q_proj) {  // identity, or identity on the QK side: the stream itself is q and k
    const Tensor k = symmetric ? keys_of(xb) : xb;
    const Tensor v = v_proj ? (*v_proj)(xb) : xb;
    if (decoding) return attend_cached(xb, k, v, mask, *cache, x.dim() == 2);
    return attend(xb, k, v, mask, need_weights, cache, x.dim() == 2);
  }
  const Linear& k_lin = k_proj ? *k_proj : *q_proj;
  if (!need_weights && cache == nullptr && !hooked()) {
    // One GEMM over the stacked weights [W_q; W_k; W_v] makes q, k and v side by side, and one fused
    // op attends every head reading them in place. Symmetric keys: the rows of W_q (and b_q) times s.
    const Tensor signs = symmetric ? key_signs(q_proj->weight.dtype()) : Tensor();
    const Tensor wk = symmetric ? q_proj->weight * reshape(signs, {-1, 1}) : k_lin.weight;
    const Tensor w = concat({q_proj->weight, wk, v_proj->weight}, 0);
    const Tensor b = o.qkv_bias ? concat({q_proj->bias, symmetric ? q_proj->bias * signs : k_lin.bias, v_proj->bias}, 0)
                                : Tensor();
    const FusedMask m = fused_mask(mask, xb.size(0), o.n_heads, xb.size(1), xb.size(1));
    AttentionResult r;
    r.output = (*out_proj)(scaled_dot_product_attention(linear(xb, w, b), o.n_heads, o.n_kv_heads, o.d_head, o.d_v,
                                                        scale(), m.causal, m.allowed));
    if (x.dim() == 2) r.output = unbatched(r.output);
    return r;
  }
  // Also decoding: a few new positions, for which three products cost less than one on weights
  // concatenated anew at every step (a copy of 3·d_model² weights).
  const Tensor q = (*q_proj)(xb);
  const Tensor k = k_proj ? (*k_proj)(xb) : symmetric ? keys_of(q) : q;
  if (decoding) return attend_cached(q, k, (*v_proj)(xb), mask, *cache, x.dim() == 2);
  return attend(q, k, (*v_proj)(xb), mask, need_weights, cache, x.dim() == 2);
}

AttentionResult MultiHeadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                            const AttentionMask& mask, bool need_weights, KVCache* cache) const {
  const auto& o = options_;
  check_input("query", query, o.d_model);
  check_input("key", key, o.kdim);
  check_input("value", value, o.vdim);
  if (query.dim() != key.dim() || key.dim() != value.dim())
    fail(who, "query {}, key {} and value {} must all be batched or all unbatched", to_string(query.shape()),
         to_string(key.shape()), to_string(value.shape()));
  const Tensor qb = batched(query), kb = batched(key), vb = batched(value);
  if (qb.size(0) != kb.size(0) || kb.size(0) != vb.size(0) || kb.size(1) != vb.size(1))
    fail(who, "query {}, key {} and value {} need one batch size, and key and value one length",
         to_string(query.shape()), to_string(key.shape()), to_string(value.shape()));
  const bool symmetric = o.qk == QK::symmetric;
  const bool decoding = cache != nullptr && !need_weights && !hooked() && !is_grad_enabled();
  Tensor q = qb, k = kb, v = v_proj ? (*v_proj)(vb) : vb;
  if (q_proj) {
    const Linear& k_lin = k_proj ? *k_proj : *q_proj;
    q = (*q_proj)(qb), k = k_lin(kb);
  }
  if (symmetric) k = keys_of(k);
  if (decoding) return attend_cached(q, k, v, mask, *cache, query.dim() == 2);
  return attend(q, k, v, mask, need_weights, cache, query.dim() == 2);
}

Tensor MultiHeadAttention::forward_gathered(const Tensor& table, const IndexArray& rows, const IndexArray& query_rows,
                                           const AttentionMask& mask) const {
  const auto& o = options_;
  if (table.dim() != 2 || table.size(1) != o.d_model)
    fail(who, "forward_gathered: table of shape {} must be (N, {})", to_string(table.shape()), o.d_model);
  if (rows.dimension() != 2 || query_rows.dimension() != 2 || query_rows.shape()[0] != rows.shape()[0] ||
      query_rows.shape()[1] > rows.shape()[1])
    fail(who, "forward_gathered: rows {} and query_rows {} must be (B, Tk) and (B, Tq) with Tq ≤ Tk",
         to_string(to_shape(rows.shape())), to_string(to_shape(query_rows.shape())));
  if (!q_proj || !v_proj || hooked()) {
    const Tensor x = embedding(table, rows);
    return forward(embedding(table, query_rows), x, x, mask).output;
  }
  const Tensor q_table = (*q_proj)(table);
  const Tensor k_table = k_proj ? (*k_proj)(table) : o.qk == QK::symmetric ? keys_of(q_table) : q_table;
  return attend(embedding(q_table, query_rows), embedding(k_table, rows), embedding((*v_proj)(table), rows), mask, false,
                nullptr, false)
      .output;
}

AttentionResult MultiHeadAttention::attend_cached(const Tensor& q, const Tensor& k, const Tensor& v,
                                                  const AttentionMask& mask, KVCache& cache, bool unbatched_input) const {
  const auto& o = options_;
  const KVCache before = cache;  // a snapshot: what a failed step restores
  try {
    cache.append(k, v);
    const std::size_t B = q.size(0), Tq = q.size(1), Tk = cache.length();
    const FusedMask m = fused_mask(mask, B, o.n_heads, Tq, Tk);
    AttentionResult r;
    r.output = (*out_proj)(detail::cached_attention(q, cache.key_buffer(), cache.value_buffer(), Tk, o.n_heads,
                                                    o.n_kv_heads, scale(), m.causal, m.allowed));
    if (unbatched_input) r.output = unbatched(r.output);
    return r;
  } catch (...) {
    cache = before;
    throw;
  }
}

bool MultiHeadAttention::hooked() const {
  return !(hook_q.empty() && hook_k.empty() && hook_v.empty() && hook_attn_scores.empty() && hook_pattern.empty() &&
           hook_z.empty());
}

AttentionResult MultiHeadAttention::attend(Tensor q, Tensor k, Tensor v, const AttentionMask& mask, bool need_weights,
                                           KVCache* cache, bool unbatched_input) const {
  // q (B, Tq, H·dh), k (B, Tnew, Hkv·dh), v (B, Tnew, Hkv·dv). Query heads come in Hkv groups of
  // G = H/Hkv; head h reads kv head h/G (as repeat_interleave would pair them).
  const auto& o = options_;
  using I = std::int64_t;
  const I B = I(q.size(0)), Tq = I(q.size(1)), Tnew = I(k.size(1));
  const I H = I(o.n_heads), Hkv = I(o.n_kv_heads), G = H / Hkv, dh = I(o.d_head), dv = I(o.d_v);
  if (!need_weights && cache == nullptr && !hooked()) {
    // One fused op, on the heads as the projections packed them.
    const FusedMask m = fused_mask(mask, std::size_t(B), std::size_t(H), std::size_t(Tq), std::size_t(Tnew));
    AttentionResult r;
    r.output = (*out_proj)(scaled_dot_product_attention(q, k, v, o.n_heads, o.n_kv_heads, scale(), m.causal, m.allowed));
    if (unbatched_input) r.output = unbatched(r.output);
    return r;
  }
  if (hooked()) {  // each as (B, T, heads, width)
    q = reshape(hook_q(reshape(q, {B, Tq, H, dh})), {B, Tq, H * dh});
    k = reshape(hook_k(reshape(k, {B, Tnew, Hkv, dh})), {B, Tnew, Hkv * dh});
    v = reshape(hook_v(reshape(v, {B, Tnew, Hkv, dv})), {B, Tnew, Hkv * dv});
  }
  // With a cache: the cached positions' keys and values before the new ones (the cache takes the
  // new ones once the step has succeeded).
  KVCache extended;
  if (cache) {
    extended = *cache;
    extended.append(k, v);
    if (is_grad_enabled() && (k.requires_grad() || v.requires_grad())) {
      // The new positions keep their gradient; the cached ones are constants.
      if (cache->length() > 0) {
        k = concat({cache->keys(), k}, 1);
        v = concat({cache->values(), v}, 1);
      }
    } else {
      k = extended.keys();
      v = extended.values();
    }
  }
  const I Tk = I(k.size(1));
  Tensor q5 = permute(reshape(q, {B, Tq, Hkv, G, dh}), {0, 2, 3, 1, 4});  // (B, Hkv, G, Tq, dh)
  Tensor k4 = permute(reshape(k, {B, Tk, Hkv, dh}), {0, 2, 1, 3});        // (B, Hkv, Tk, dh)
  Tensor v4 = permute(reshape(v, {B, Tk, Hkv, dv}), {0, 2, 1, 3});        // (B, Hkv, Tk, dv)
  Tensor scores = matmul(q5, transpose(reshape(k4, {B, Hkv, 1, Tk, dh}), -1, -2)) * scale();  // (B, Hkv, G, Tq, Tk)
  scores = reshape(scores, {B, H, Tq, Tk});
  const MaskArray allowed = allowed_keys(mask, std::size_t(B), std::size_t(H), std::size_t(Tq), std::size_t(Tk));
  if (allowed.dimension() > 0) scores = masked_fill(scores, !allowed, -std::numeric_limits<double>::infinity());
  scores = hook_attn_scores(scores);
  const Tensor weights = hook_pattern(softmax(scores, -1));
  const Tensor heads = reshape(matmul(reshape(weights, {B, Hkv, G, Tq, Tk}), reshape(v4, {B, Hkv, 1, Tk, dv})),
                               {B, H, Tq, dv});
  const Tensor z = hook_z(permute(heads, {0, 2, 1, 3}));  // (B, Tq, H, dv)
  AttentionResult r;
  r.output = (*out_proj)(reshape(z, {B, Tq, H * dv}));  // heads side by side
  if (cache) *cache = extended;  // only once the step has succeeded: a failed call leaves the cache as it was
  if (need_weights) {
    r.weights = weights;
    r.scores = scores;
    r.heads = !hooked() ? heads : permute(z, {0, 2, 1, 3});
  }
  if (unbatched_input) {
    r.output = unbatched(r.output);
    r.weights = unbatched(r.weights);
    r.scores = unbatched(r.scores);
    r.heads = unbatched(r.heads);
  }
  return r;
}

Tensor MultiHeadAttention::W_q(std::size_t h) const {
  kv_head_of(h);  // checks h
  const auto& o = options_;
  if (!q_proj) return identity_columns(o.d_model, h * o.d_head, o.d_head, out_proj->weight.dtype());
  return rows_transposed(q_proj->weight, h * o.d_head, o.d_head);
}

Tensor MultiHeadAttention::W_k(std::size_t h) const {
  const std::size_t kv = kv_head_of(h);
  const auto& o = options_;
  const Tensor w = !q_proj ? identity_columns(o.d_model, kv * o.d_head, o.d_head, out_proj->weight.dtype())
                           : rows_transposed((k_proj ? k_proj : q_proj)->weight, kv * o.d_head, o.d_head);
  if (o.qk != QK::symmetric) return w;
  NoGradGuard no_grad;
  return w * slice(key_signs(w.dtype()), 0, 0, std::int64_t(o.d_head));  // W_q(h) diag(s); s is the same per head
}

const Tensor& MultiHeadAttention::key_signs(DType dtype) const {
  return dtype == DType::float32 ? signs32_ : signs64_;
}

Tensor MultiHeadAttention::keys_of(const Tensor& q) const {
  return q * key_signs(q.dtype());  // (..., H·d_head) ⊙ s
}

Tensor MultiHeadAttention::W_v(std::size_t h) const {
  const std::size_t kv = kv_head_of(h);
  const auto& o = options_;
  if (!v_proj) return identity_columns(o.d_model, kv * o.d_v, o.d_v, out_proj->weight.dtype());
  return rows_transposed(v_proj->weight, kv * o.d_v, o.d_v);
}

Tensor MultiHeadAttention::W_o(std::size_t h) const {
  kv_head_of(h);
  NoGradGuard no_grad;
  const auto& o = options_;
  const Tensor cols = slice(out_proj->weight, 1, std::int64_t(h * o.d_v), std::int64_t((h + 1) * o.d_v));
  return transpose(cols, 0, 1).detach();  // (d_v, d_model)
}

}  // namespace qkv::nn
