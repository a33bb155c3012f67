#pragma once
// Multi-head attention with every option the experiments need, in the seeds' notation:
// for head h, q = x·W_q(h), k = x·W_k(h), v = x·W_v(h) (each d_model × d_head, W_v d_model × d_v),
// score = q·k · scale, weights = softmax over keys, head output = weights·v, and
// output = Σ_h head_h · W_o(h) + b_o (W_o(h) is d_v × d_model).
#include <memory>
#include <optional>

#include "qkv/core/random.hpp"
#include "qkv/nn/hooks.hpp"
#include "qkv/nn/layers.hpp"

namespace qkv::nn {

// How keys relate to queries. untied: k_proj of its own. tied: k_proj *is* q_proj (one parameter),
// so a head's scores are a Gram matrix, symmetric and positive semi-definite. symmetric: k = q ⊙ s
// for a fixed sign vector s (per head: the first ⌈d_head/2⌉ entries +1, the rest −1), so scores
// are symmetric but indefinite, the control that separates symmetry from positive definiteness.
enum class QK { untied, tied, symmetric };
// Of q, k and v (out_proj is always learned). identity: none of the three, each head reads its own
// slice of the stream as its query, key and value. identity_qk: W_q = W_k = I on the head's slice,
// and a learned W_v: the QK side of identity alone, the control that leaves the values trainable.
enum class Projection { learned, frozen, identity, identity_qk };

struct MultiHeadAttentionOptions {
  std::size_t d_model = 0;
  std::size_t n_heads = 1;
  std::size_t n_kv_heads = 0;  // 0: n_heads. 1 is MQA; a divisor of n_heads in between is GQA
  std::size_t d_head = 0;      // 0: d_model / n_heads
  std::size_t d_v = 0;         // 0: d_head
  std::size_t kdim = 0;        // width of the key input; 0: d_model (cross-attention may differ)
  std::size_t vdim = 0;        // width of the value input; 0: d_model
  bool qkv_bias = true;        // GPT-2: all biases; Llama: none; Qwen: q/k/v only
  bool out_bias = true;
  std::optional<double> scale = std::nullopt;  // default 1/√d_head
  QK qk = QK::untied;
  Projection proj = Projection::learned;
  DType dtype = DType::float32;  // of the parameters when built; Module::to changes it later
};

// Which keys each query may attend. `true` means "may attend" throughout, as in PyTorch's
// scaled_dot_product_attention; note that PyTorch's key_padding_mask has the opposite polarity.
struct AttentionMask {
  bool causal = false;                    // query i (at position Tk − Tq + i) sees keys 0 … Tk − Tq + i
  MaskArray key_padding = MaskArray();    // (B, Tk): true for a real key, false for padding; 0-d: none
  MaskArray allowed = MaskArray();        // broadcastable to (B, H, Tq, Tk); 0-d: none
};

struct AttentionResult {
  Tensor output;  // (B, Tq, d_model)
  // Only with need_weights (otherwise undefined):
  Tensor weights;  // (B, H, Tq, Tk), each row sums to 1 (0 for a fully masked row)
  Tensor scores;   // (B, H, Tq, Tk) before softmax: scaled, −inf where masked
  Tensor heads;    // (B, H, Tq, d_v): each head's output before out_proj
};

// Keys and values of past positions, for step-by-step decoding: MultiHeadAttention::forward with a
// cache attends them and appends the new positions'. They sit in buffers with room for more
// positions (doubling when full), so that a step appends without copying the past. A copy of a
// cache is a snapshot: it shares the buffers, and the positions it holds stay as they were
// whatever the other copy appends (an append that would overwrite what another copy holds
// copies the buffers first).
class KVCache {
 public:
  std::size_t length() const { return length_; }  // cached positions T
  // B · T · n_kv_heads · (d_head + d_v) · sizeof(dtype): this layer's cache for B sequences.
  std::size_t bytes() const;
  std::size_t bytes_per_sequence() const;
  // The bytes its buffers take, room for later positions included (at most twice bytes(), once
  // it has grown).
  std::size_t capacity_bytes() const;
  void clear() { *this = KVCache(); }
  // Copies of the cached keys (B, T, n_kv_heads · d_head) and values (B, T, n_kv_heads · d_v),
  // heads side by side as the projections write them; undefined when empty.
  Tensor keys() const;
  Tensor values() const;
  // Appends keys (B, T_new, n_kv_heads · d_head) and values (B, T_new, n_kv_heads · d_v) of the
  // next positions; std::invalid_argument when they do not fit what it holds.
  void append(const Tensor& keys, const Tensor& values);

  // The buffers, (B, capacity, ·): rows past length() are not the cache's.
  const Tensor& key_buffer() const;
  const Tensor& value_buffer() const;

 private:
  struct Buffers {
    Tensor keys, values;  // (B, capacity, ·)
    std::size_t used = 0;  // rows written by the copy that appended last
  };
  std::shared_ptr<Buffers> buffers_;
  std::size_t length_ = 0;
};

class MultiHeadAttention : public Module {
 public:
  explicit MultiHeadAttention(const MultiHeadAttentionOptions& options, Generator& gen = default_generator());

  // Self-attention. Without need_weights or hooks, one GEMM makes q, k and v side by side and one
  // fused op (scaled_dot_product_attention) attends every head in place, and so do decoding steps
  // with a cache under NoGradGuard (reading the cached keys and values in place); otherwise the
  // steps run as separate ops, keeping scores and weights. With gradients on, a step with a cache
  // passes gradients to its new positions' keys and values (the cached ones are constants).
  // x is (B, T, d_model), or (T, d_model) unbatched (the results then have no B dimension).
  AttentionResult forward(const Tensor& x, const AttentionMask& mask = {}, bool need_weights = false,
                          KVCache* cache = nullptr) const;
  // Cross-attention (or self-attention with separate inputs): query (B, Tq, d_model),
  // key (B, Tk, kdim), value (B, Tk, vdim).
  AttentionResult forward(const Tensor& query, const Tensor& key, const Tensor& value,
                          const AttentionMask& mask = {}, bool need_weights = false, KVCache* cache = nullptr) const;

  // Self-attention over x = table[rows] for the queries at table[query_rows]: table (N, d_model),
  // rows (B, Tk) and query_rows (B, Tq), the last Tq positions of the sequences (Tq ≤ Tk). Returns
  // the output (B, Tq, d_model), forward(table[query_rows], table[rows], table[rows]).output:
  // the projections run on the table's N rows and are gathered, which costs less when N is below
  // B · Tk (a small vocabulary at layer 0). Without hooks or a learned-or-frozen q (identity):
  // forward on the gathered rows.
  Tensor forward_gathered(const Tensor& table, const IndexArray& rows, const IndexArray& query_rows,
                          const AttentionMask& mask = {}) const;

  // Per-head matrices, copies: W_q, W_k (d_model × d_head), W_v (d_model × d_v) and
  // W_o (d_v × d_model). W_k and W_v take a query head: under GQA/MQA they return the matrices
  // of the kv head that query head h reads.
  Tensor W_q(std::size_t h) const;
  Tensor W_k(std::size_t h) const;
  Tensor W_v(std::size_t h) const;
  Tensor W_o(std::size_t h) const;
  std::size_t kv_head_of(std::size_t h) const;
  // QK::symmetric's signs s, (n_heads · d_head): ±1, the same pattern in every head (undefined for
  // the other options).
  const Tensor& key_signs(DType dtype) const;

  const MultiHeadAttentionOptions& options() const { return options_; }

  // Null where the option removes them: k_proj when tied or symmetric (q_proj serves), q/k/v for
  // identity.
  std::unique_ptr<Linear> q_proj, k_proj, v_proj, out_proj;

  // Hook points (see hooks.hpp), named and shaped as in TransformerLens: hook_q (B, Tq, H,
  // d_head), hook_k (B, Tk, n_kv_heads, d_head) and hook_v (B, Tk, n_kv_heads, d_v) for the new
  // positions only under a KV cache, hook_attn_scores (B, H, Tq, Tk: scaled, −inf where masked),
  // hook_pattern (the weights, B, H, Tq, Tk) and hook_z (each head's output before out_proj, B, Tq,
  // H, d_v). An unbatched input is seen with B = 1. With a hook installed, forward runs op by op,
  // never in the fused kernel (in float32 its results may then differ in the last bits). A
  // Transformer names them blocks.L.attn.hook_q and so on.
  HookPoint hook_q, hook_k, hook_v, hook_attn_scores, hook_pattern, hook_z;
  // Whether any of them has a hook.
  bool hooked() const;

 protected:
  const char* type_name() const override { return "MultiHeadAttention"; }

 private:
  double scale() const;  // options().scale, or 1/√d_head
  Tensor keys_of(const Tensor& q) const;  // QK::symmetric: k = q ⊙ s
  AttentionResult attend(Tensor q, Tensor k, Tensor v, const AttentionMask& mask, bool need_weights, KVCache* cache,
                         bool unbatched) const;
  // Decoding without weights or hooks, outside autograd: appends k and v (B, T_new, ·) to the
  // cache and attends the queries q (B, Tq, H·d_head) to all it holds in the fused kernel.
  AttentionResult attend_cached(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionMask& mask,
                                KVCache& cache, bool unbatched) const;
  MultiHeadAttentionOptions options_;
  Tensor signs32_, signs64_;  // key_signs
};

}  // namespace qkv::nn
