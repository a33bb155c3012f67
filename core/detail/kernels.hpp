#pragma once
// Vectorised float32 loops for the hot rows of attention. Each is compiled for AVX-512, AVX2 and
// the x86-64 baseline, and the CPU picks one when the program loads (target_clones). Sums run in
// 16 fixed lanes and no multiply-add is fused, so every version computes the same bits.
#include <cstddef>

namespace qkv::detail {

// x[j] = e^(x[j] − shift) for j < n; returns Σ x[j]. Arguments below −87.3 (−inf among them) give
// exactly 0, and above 88 give e^88.
float exp_shifted_sum(float* x, std::size_t n, float shift);
// max over x[0, n); −inf for n = 0.
float max_of(const float* x, std::size_t n);
// x[j] *= factor.
void scale_by(float* x, std::size_t n, float factor);
// Softmax backward on a row: d[j] = p[j] · (d[j] − Σ_k p[k] d[k]).
void softmax_backward_row(const float* p, float* d, std::size_t n);

// e^x, as exp_shifted_sum computes it, for tests.
float vector_exp(float x);

}  // namespace qkv::detail
