#pragma once
// Vectorised float32 loops for the rows of attention. Each is compiled for AVX-512, AVX2 and the
// x86-64 baseline, and the CPU picks one when the program loads (target_clones). Sums and maxima
// run in 16 fixed lanes reduced pairwise, and no multiply-add is fused, so every version computes
// the same bits.
//
// A row is `width` floats, a multiple of row_lanes, of which the first n are visible; the kernels
// read and write whole chunks of row_lanes up to the one that holds entry n − 1, and only zero
// the rest.
#include <cstddef>

namespace qkv::detail {

constexpr std::size_t row_lanes = 16;

// The row's softmax in place: x[j] = e^(s_j − max s) / Σ e^(s_k − max s) with s = scale · x over
// j < n, and x[j] = 0 from n on. A row with nothing visible, or only scores of −inf, becomes 0.
void softmax_row(float* x, std::size_t n, std::size_t width, float scale);
// Softmax backward in place of d, for p a row softmax_row made (0 from n on):
// d[j] = scale · p[j] · (d[j] − Σ_k p[k] d[k]) for j < n, and 0 from n on.
void softmax_backward_row(const float* p, float* d, std::size_t n, std::size_t width, float scale);

// e^x as softmax_row computes it: within 2 ulp over [−87.3, 88], 0 below (−inf included).
float vector_exp(float x);

}  // namespace qkv::detail
