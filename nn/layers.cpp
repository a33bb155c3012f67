#include "qkv/nn/layers.hpp"

#include <cmath>

#include "qkv/core/ops.hpp"

namespace qkv::nn {

namespace {

Tensor parameter(Tensor value) {
  value.requires_grad_();
  return value;
}

// x + table[offset : offset + T], checking that the table is long and wide enough.
Tensor add_positions(const char* who, const Tensor& x, const Tensor& table, std::size_t offset) {
  const Shape sx = x.shape(), st = table.shape();
  if (sx.size() < 2 || sx.back() != st[1])
    fail(who, "input {} must be (..., T, {})", to_string(sx), st[1]);
  const std::size_t T = sx[sx.size() - 2];
  if (offset + T > st[0]) fail(who, "positions {} to {} are beyond max_len {}", offset, offset + T, st[0]);
  return x + slice(table, 0, std::int64_t(offset), std::int64_t(offset + T));
}

}  // namespace

Linear::Linear(std::size_t in_features, std::size_t out_features, bool with_bias, DType dtype, Generator& gen) {
  const double bound = in_features > 0 ? 1.0 / std::sqrt(double(in_features)) : 0.0;
  weight = parameter(uniform({out_features, in_features}, -bound, bound, dtype, gen));
  register_parameter("weight", weight);
  if (with_bias) {
    bias = parameter(uniform({out_features}, -bound, bound, dtype, gen));
    register_parameter("bias", bias);
  }
}

Tensor Linear::forward(const Tensor& x) const { return linear(x, weight, bias); }

Embedding::Embedding(std::size_t num_embeddings, std::size_t embedding_dim, DType dtype, Generator& gen)
    : weight(parameter(randn({num_embeddings, embedding_dim}, dtype, gen))) {
  register_parameter("weight", weight);
}

Tensor Embedding::forward(const IndexArray& indices) const { return embedding(weight, indices); }

LayerNorm::LayerNorm(std::size_t dim, double eps_, bool elementwise_affine, DType dtype) : eps(eps_) {
  if (elementwise_affine) {
    weight = parameter(ones({dim}, dtype));
    bias = parameter(zeros({dim}, dtype));
    register_parameter("weight", weight);
    register_parameter("bias", bias);
  }
}

Tensor LayerNorm::forward(const Tensor& x) const { return layer_norm(x, weight, bias, eps); }

LearnedPositionalEncoding::LearnedPositionalEncoding(std::size_t max_len, std::size_t d_model, DType dtype,
                                                     Generator& gen)
    : weight(parameter(randn({max_len, d_model}, dtype, gen))) {
  register_parameter("weight", weight);
}

Tensor LearnedPositionalEncoding::forward(const Tensor& x, std::size_t offset) const {
  return add_positions("LearnedPositionalEncoding", x, weight, offset);
}

SinusoidalPositionalEncoding::SinusoidalPositionalEncoding(std::size_t max_len, std::size_t d_model) {
  Array<double> p = Array<double>::from_shape({max_len, d_model});
  for (std::size_t t = 0; t < max_len; ++t)
    for (std::size_t d = 0; d < d_model; ++d) {
      const double angle = double(t) / std::pow(10000.0, double(d - d % 2) / double(d_model));
      p(t, d) = d % 2 == 0 ? std::sin(angle) : std::cos(angle);
    }
  table64_ = Tensor(std::move(p));
  table32_ = table64_.to(DType::float32);
}

Tensor SinusoidalPositionalEncoding::forward(const Tensor& x, std::size_t offset) const {
  return add_positions("SinusoidalPositionalEncoding", x, table(x.dtype()), offset);
}

}  // namespace qkv::nn
