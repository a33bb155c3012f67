#pragma once
// Attention against a KV cache's buffers, for decoding: the fused kernel of
// scaled_dot_product_attention reading keys and values in place.
#include <cstddef>

#include "qkv/core/tensor.hpp"

namespace qkv::detail {

// Queries (B, Tq, H·d_head) against the first
// `length` rows of each batch entry of `keys` (B, capacity, Hkv·d_head) and `values`
// (B, capacity, Hkv·d_v); the output (B, Tq, H·d_v). A causal query i sees keys up to
// length − Tq + i; `allowed` is (B, H, Tq, length) or 0-d. Forward only: throws std::invalid_argument
// when a gradient would be recorded, or when the shapes do not fit.
Tensor cached_attention(const Tensor& q, const Tensor& keys, const Tensor& values, std::size_t length,
                        std::size_t n_heads, std::size_t n_kv_heads, double scale, bool causal, const MaskArray& allowed);

}  // namespace qkv::detail
