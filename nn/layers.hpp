#pragma once
// The simple layers, with PyTorch's layouts and initialisations.
#include <cstdint>

#include "qkv/core/random.hpp"
#include "qkv/nn/module.hpp"

namespace qkv::nn {

// y = x Wᵀ + b, weight (out, in), both drawn from U(−1/√in, 1/√in) as torch.nn.Linear does.
class Linear : public Module {
 public:
  Linear(std::size_t in_features, std::size_t out_features, bool bias = true, DType dtype = DType::float32,
         Generator& gen = default_generator());
  Tensor forward(const Tensor& x) const;  // (..., in) -> (..., out)
  Tensor operator()(const Tensor& x) const { return forward(x); }

  Tensor weight;  // (out, in)
  Tensor bias;    // (out), or undefined
};

// Rows of a (V, D) table drawn from N(0, 1), as torch.nn.Embedding.
class Embedding : public Module {
 public:
  Embedding(std::size_t num_embeddings, std::size_t embedding_dim, DType dtype = DType::float32,
            Generator& gen = default_generator());
  Tensor forward(const IndexArray& indices) const;  // (...) -> (..., D)
  Tensor operator()(const IndexArray& indices) const { return forward(indices); }

  Tensor weight;  // (V, D)
};

// Normalises the last dimension; weight 1 and bias 0 at first, as torch.nn.LayerNorm.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::size_t dim, double eps = 1e-5, bool elementwise_affine = true, DType dtype = DType::float32);
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }

  Tensor weight, bias;  // (dim) each, or undefined without the affine transform
  double eps;
};

// x + P[offset : offset + T] for x (..., T, D): learned positions, a (max_len, D) table from N(0, 1).
class LearnedPositionalEncoding : public Module {
 public:
  LearnedPositionalEncoding(std::size_t max_len, std::size_t d_model, DType dtype = DType::float32,
                            Generator& gen = default_generator());
  Tensor forward(const Tensor& x, std::size_t offset = 0) const;
  Tensor operator()(const Tensor& x, std::size_t offset = 0) const { return forward(x, offset); }

  Tensor weight;  // (max_len, D)
};

// x + P[offset : offset + T] with the fixed sinusoids of "Attention Is All You Need":
// P[t, 2i] = sin(t / 10000^(2i/D)), P[t, 2i+1] = cos(t / 10000^(2i/D)). No parameters.
class SinusoidalPositionalEncoding : public Module {
 public:
  SinusoidalPositionalEncoding(std::size_t max_len, std::size_t d_model);
  Tensor forward(const Tensor& x, std::size_t offset = 0) const;
  Tensor operator()(const Tensor& x, std::size_t offset = 0) const { return forward(x, offset); }

  const Tensor& table(DType dtype) const { return dtype == DType::float32 ? table32_ : table64_; }  // (max_len, D)

 private:
  Tensor table32_, table64_;
};

}  // namespace qkv::nn
