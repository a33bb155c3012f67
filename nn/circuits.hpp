#pragma once
// Circuits: read-only analysis of a trained MultiHeadAttention head, in float64 and in the seeds'
// notation. For head h the QK circuit A = W_q(h) W_k(h)ᵀ (d_model × d_model, rank ≤ d_head)
// defines what "matching" means: score(i, j) = x_i A x_jᵀ · scale, plus bias terms. The OV
// circuit W_v(h) W_o(h) decides what a chosen token moves, and where it lands.
//
// Inspect A, never W_q or W_k alone: W_q M and W_k M⁻ᵀ give the same model for any invertible M.
#include <complex>
#include <optional>
#include <vector>

#include "qkv/nn/attention.hpp"

namespace qkv::nn {

// A = W_q(h) W_k(h)ᵀ, d_model × d_model.
Array<double> qk_circuit(const MultiHeadAttention& attention, std::size_t h);
// W_v(h) W_o(h), d_model × d_model.
Array<double> ov_circuit(const MultiHeadAttention& attention, std::size_t h);

// How much head h2 of a later layer reads what head h1 of an earlier layer writes (Elhage et al.
// 2021, "A Mathematical Framework for Transformer Circuits"), as TransformerLens computes it:
// ‖W_A W_B‖_F / (‖W_A‖_F ‖W_B‖_F), W_A = h1's OV circuit and W_B = h2's QK circuit for
// Q-composition (h1's output in h2's queries: x W_OV A), its transpose for K-composition (in h2's
// keys: x A (x' W_OV)ᵀ = x A W_OVᵀ x'ᵀ), or h2's OV circuit for V-composition (in its values). In
// [0, 1]; the LayerNorms between the layers are left out. Throws std::invalid_argument when a
// circuit is zero.
enum class Composition { q, k, v };
double composition_score(const MultiHeadAttention& writer, std::size_t h1, const MultiHeadAttention& reader, std::size_t h2,
                         Composition kind);

// The symmetric-energy share σ = ‖(A+Aᵀ)/2‖²_F / ‖A‖²_F of a square matrix: 1 when A is
// symmetric (tied, symmetric or identity projections), 0 when it is antisymmetric, and about
// 0.5 + 1/(2n) for a random n × n product of untied Gaussian projections.
double symmetric_share(const Array<double>& a);
// ‖A − Aᵀ‖_F / ‖A‖_F, in [0, 2]; equal to 2·√(1 − σ). Applied to the pre-softmax scores S of
// a real input it counts differences softmax never sees (softmax_invariant_asymmetry does not).
double antisymmetry(const Array<double>& a);

// The asymmetry of one head's scores that softmax can see, on one sequence: S (T, T) pre-softmax,
// rows queries; `allowed` (T, T) true where query i may attend key j. Softmax ignores a constant
// added to a query's row, so ‖S − Sᵀ‖ counts differences no weight shows; and a masked score is
// never used. Over the pairs i ≠ j that see each other both ways: the part of S − Sᵀ that no
// per-query constants c can cancel, min_c ‖S − Sᵀ + c1ᵀ − 1cᵀ‖, relative to ‖S‖ with each row
// centred over the keys its query sees. 0 for any symmetric score (and it stays 0 when a query's
// row is shifted); none when no pair sees each other both ways, as under a causal mask, where the
// direction is the mask's, or when one of their scores is not finite. What is left is the cyclic part of the flow S − Sᵀ: rps's 3-cycle has
// it, a ranking by a per-item value has none.
std::optional<double> softmax_invariant_asymmetry(const Array<double>& scores, const MaskArray& allowed);

struct MatrixSpectrum {
  std::vector<double> singular_values;             // descending
  double stable_rank = 0;                          // ‖A‖²_F / ‖A‖²_2 = Σ s² / s_max²; 0 for A = 0
  std::size_t rank = 0;                            // singular values above max(m, n) · ε · s_max (numpy's rule)
  std::vector<std::complex<double>> eigenvalues;   // square A only: by modulus, descending; conjugate pairs adjacent
};

// Singular values (LAPACK gesdd), stable and numerical rank, and for a square matrix its
// eigenvalues (LAPACK geev). Throws std::invalid_argument for a matrix that is not 2-D or holds
// a non-finite value.
MatrixSpectrum spectrum(const Array<double>& a);

class TransformerBlock;  // transformer.hpp

// The scores a layer's heads give when the stream holds only the rows of `table` (N, d_model),
// after the layer's LayerNorm, biases included, scaled, no mask: (1, H, N, N). With the token
// embeddings it is the token table (query token × key token); with the positions, the position table.
Tensor table_scores(const TransformerBlock& block, const Tensor& table);

}  // namespace qkv::nn
