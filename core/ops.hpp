#pragma once
// Every differentiable op. Each one's backward sits beside its forward in the .cpp named below.
// Axes may be negative (counted from the end). Bad arguments throw std::invalid_argument naming
// the op and the shapes or values at fault; mixing float32 and float64 in one op is an error.
#include <cstdint>
#include <vector>

#include "qkv/core/random.hpp"
#include "qkv/core/tensor.hpp"

namespace qkv {

// --- elementwise.cpp: numpy broadcasting; gradients are summed back to each input's shape.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor pow(const Tensor& x, double exponent);
Tensor tanh(const Tensor& x);
Tensor relu(const Tensor& x);
enum class GeluApproximation { none, tanh };  // none: x·Φ(x) with erf, PyTorch's default
Tensor gelu(const Tensor& x, GeluApproximation approximate = GeluApproximation::none);
Tensor cast(const Tensor& x, DType dtype);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& x);
// With a number: the number becomes a 0-d tensor of the tensor's dtype.
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);

// --- matmul.cpp: (..., n, k) @ (..., k, m) -> (..., n, m) with broadcast batch dimensions,
// through BLAS gemm. A 1-D operand is a row (left) or a column (right) vector, as in numpy.
Tensor matmul(const Tensor& a, const Tensor& b);
// As torch.nn.functional.linear: x (..., in), weight (out, in), bias (out) or undefined ->
// x Wᵀ + b (..., out), as one gemm with no transposed copy of the weight.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

// --- attention.cpp: softmax(scale · q kᵀ) v for every head at once, the heads side by side in the
// last dimension as projections produce them: q (B, Tq, H·dh), k (B, Tk, Hkv·dh), v (B, Tk, Hkv·dv)
// -> (B, Tq, H·dv); query head h reads kv head h / (H / Hkv) (MQA, GQA). `causal`: query i sees
// keys 0 … Tk − Tq + i (none when Tq > Tk + i). `allowed` (B, H, Tq, Tk), true = may attend, or
// 0-d for none. A query that may attend no key gets zeros (and passes no gradient). Past 64 keys it works in tiles
// (FlashAttention): backward keeps the inputs, the output and two numbers per query, and computes
// the weights again, so memory grows with T, not T² (but for a mask given, which it copies); up
// to 64 keys it keeps the weights.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, std::size_t n_heads,
                                    std::size_t n_kv_heads, double scale, bool causal,
                                    const MaskArray& allowed = MaskArray());
// Self-attention with q, k and v side by side in one tensor, as one projection makes them:
// qkv (B, T, H·d_head + Hkv·d_head + Hkv·d_v) -> (B, T, H·d_v). Read in place, no copies.
Tensor scaled_dot_product_attention(const Tensor& qkv, std::size_t n_heads, std::size_t n_kv_heads, std::size_t d_head,
                                    std::size_t d_v, double scale, bool causal, const MaskArray& allowed = MaskArray());

// --- shape_ops.cpp
Tensor reshape(const Tensor& x, const std::vector<std::int64_t>& shape);  // one entry may be -1
Tensor permute(const Tensor& x, const std::vector<std::int64_t>& dims);
Tensor transpose(const Tensor& x, std::int64_t dim0, std::int64_t dim1);
// Elements [start, stop) along `axis`; negative bounds count from the end.
Tensor slice(const Tensor& x, std::int64_t axis, std::int64_t start, std::int64_t stop);
Tensor concat(const std::vector<Tensor>& xs, std::int64_t axis);
// Pieces of `split_size` along `axis` (the last may be shorter), as torch.split.
std::vector<Tensor> split(const Tensor& x, std::size_t split_size, std::int64_t axis);
// Pieces of the given sizes, which must add up to the axis' size.
std::vector<Tensor> split(const Tensor& x, const std::vector<std::size_t>& sizes, std::int64_t axis);

// --- reduce.cpp: empty `axes` means every axis.
Tensor sum(const Tensor& x, const std::vector<std::int64_t>& axes = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<std::int64_t>& axes = {}, bool keepdim = false);
// As torch.amax: tied maxima share the gradient equally.
Tensor max(const Tensor& x, const std::vector<std::int64_t>& axes = {}, bool keepdim = false);

// --- softmax.cpp: max-subtracted. A row whose every entry is -inf (fully masked) gives zeros
// from softmax, -inf from log_softmax, and a zero gradient from both: never NaN.
Tensor softmax(const Tensor& x, std::int64_t axis = -1);
Tensor log_softmax(const Tensor& x, std::int64_t axis = -1);
// As torch.masked_fill: `value` where mask is true. The mask broadcasts to x's shape.
Tensor masked_fill(const Tensor& x, const MaskArray& mask, double value);

// --- loss.cpp: logits (..., C) with the class dimension last, integer targets (...).
// Mean over the targets that are not ignore_index (0 when every target is ignored).
Tensor cross_entropy(const Tensor& logits, const IndexArray& targets, std::int64_t ignore_index = -100);

// --- embedding.cpp: rows of weight (V, D) gathered by indices (...) -> (..., D).
Tensor embedding(const Tensor& weight, const IndexArray& indices);

// --- layer_norm.cpp: over the last dimension D; weight and bias (D) may be undefined.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);

// --- dropout.cpp: in training, zeroes each element with probability p and scales the rest by
// 1/(1-p); otherwise returns x itself.
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen = default_generator());

}  // namespace qkv
