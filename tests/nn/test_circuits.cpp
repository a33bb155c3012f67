#include "tests/helpers.hpp"

#include <xtensor/xadapt.hpp>
#include <xtensor-blas/xlinalg.hpp>

#include "qkv/nn/circuits.hpp"

using namespace qkv;
using namespace qkv::nn;
using namespace qkv::test;
using Catch::Matchers::Contains;

namespace {

MultiHeadAttentionOptions head_options(std::size_t d_model, std::size_t n_heads, std::size_t d_head) {
  return {.d_model = d_model, .n_heads = n_heads, .d_head = d_head, .scale = {}, .dtype = DType::float64};
}

}  // namespace

TEST_CASE("sigma and antisymmetry of hand-built matrices") {
  const Array<double> symmetric = {{2, 1}, {1, 3}};
  CHECK(symmetric_share(symmetric) == 1.0);
  CHECK(antisymmetry(symmetric) == 0.0);
  const Array<double> rotation = {{0, -1}, {1, 0}};  // antisymmetric
  CHECK(symmetric_share(rotation) == 0.0);
  CHECK(antisymmetry(rotation) == 2.0);
  // [[1, 2], [0, 1]]: ‖A‖² = 6, sym = [[1, 1], [1, 1]] with ‖sym‖² = 4: σ = 2/3;
  // A − Aᵀ = [[0, 2], [−2, 0]], ‖·‖² = 8: antisymmetry √(8/6).
  const Array<double> shear = {{1, 2}, {0, 1}};
  CHECK(symmetric_share(shear) == Approx(2.0 / 3).epsilon(1e-15));
  CHECK(antisymmetry(shear) == Approx(std::sqrt(8.0 / 6)).epsilon(1e-15));
  CHECK(antisymmetry(shear) == Approx(2 * std::sqrt(1 - symmetric_share(shear))).epsilon(1e-15));
  CHECK_THAT(invalid_argument_message([&] { symmetric_share(Array<double>::from_shape({2, 3})); }),
             Contains("symmetric_share: needs a square matrix, got shape (2,3)"));
  CHECK_THAT(invalid_argument_message([&] { antisymmetry(Array<double>({{0.0, 0.0}, {0.0, 0.0}})); }),
             Contains("antisymmetry: is undefined for a zero matrix"));
}

TEST_CASE("spectrum: singular values, stable rank, numerical rank and eigenvalues") {
  // A rank-1 matrix u vᵀ: one singular value ‖u‖‖v‖, stable rank 1, rank 1.
  const Array<double> u = {1, 2, 2}, v = {3, 0, 4};
  const Array<double> outer = xt::linalg::outer(u, v);
  const MatrixSpectrum r1 = spectrum(outer);
  REQUIRE(r1.singular_values.size() == 3);
  CHECK(r1.singular_values[0] == Approx(15).epsilon(1e-14));
  CHECK(r1.singular_values[1] < 1e-14);
  CHECK(r1.stable_rank == Approx(1).epsilon(1e-14));
  CHECK(r1.rank == 1);

  // diag(3, 2, 1) rotated in its first plane: singular values 3, 2, 1; stable rank 14/9.
  const Array<double> d = {{0, -3, 0}, {2, 0, 0}, {0, 0, 1}};
  const MatrixSpectrum s = spectrum(d);
  check_close(Array<double>(xt::adapt(s.singular_values)), {3, 2, 1}, 1e-14);
  CHECK(s.stable_rank == Approx(14.0 / 9).epsilon(1e-14));
  CHECK(s.rank == 3);
  // Its eigenvalues: ±i√6 (the 2×2 block [[0, −3], [2, 0]]) and 1, by modulus.
  REQUIRE(s.eigenvalues.size() == 3);
  CHECK(s.eigenvalues[0].real() == Approx(0).margin(1e-14));
  CHECK(s.eigenvalues[0].imag() == Approx(std::sqrt(6.0)).epsilon(1e-14));
  CHECK(s.eigenvalues[1] == std::conj(s.eigenvalues[0]));
  CHECK(s.eigenvalues[2].real() == Approx(1).epsilon(1e-14));
  CHECK(s.eigenvalues[2].imag() == 0);

  // A non-square matrix has no eigenvalues.
  const MatrixSpectrum wide = spectrum(Array<double>({{1.0, 0.0, 0.0}, {0.0, 2.0, 0.0}}));
  CHECK(wide.eigenvalues.empty());
  check_close(Array<double>(xt::adapt(wide.singular_values)), {2, 1}, 1e-15);

  CHECK_THAT(invalid_argument_message([&] { spectrum(Array<double>({{1.0, NAN}, {0.0, 1.0}})); }),
             Contains("spectrum: the matrix holds a non-finite value"));
}

TEST_CASE("the QK circuit gives the head's bias-free scores: S = X A Xᵀ · scale") {
  auto o = head_options(6, 2, 3);
  o.qkv_bias = false;
  Generator gen(4);
  const MultiHeadAttention mha(o, gen);
  const Tensor x = randn({5, 6}, DType::float64, gen);
  const Array<double> scores = mha.forward(x, {}, true).scores.value<double>();  // (H, T, T)
  const Array<double>& X = x.value<double>();
  for (std::size_t h = 0; h < 2; ++h) {
    INFO("head " << h);
    const Array<double> A = qk_circuit(mha, h);
    REQUIRE(A.shape() == std::vector<std::size_t>{6, 6});
    const Array<double> expected = xt::linalg::dot(xt::linalg::dot(X, A), xt::transpose(X)) / std::sqrt(3.0);
    check_close(Array<double>(xt::view(scores, h)), expected, 1e-12);
    // The circuit of one head has rank d_head at most; a random one has exactly that rank.
    CHECK(spectrum(A).rank == 3);
  }
}

TEST_CASE("the OV circuit is W_v(h) W_o(h): the head's contribution to the output") {
  auto o = head_options(4, 2, 2);
  o.qkv_bias = false;
  o.out_bias = false;
  Generator gen(5);
  const MultiHeadAttention mha(o, gen);
  // One token attends only to itself, so each head's output is x W_v(h) W_o(h); they add up.
  const Tensor x = randn({1, 4}, DType::float64, gen);
  const Array<double> out = mha.forward(x).output.value<double>();
  const Array<double> total = ov_circuit(mha, 0) + ov_circuit(mha, 1);
  check_close(out, xt::linalg::dot(x.value<double>(), total), 1e-12);
  CHECK(ov_circuit(mha, 1).shape() == std::vector<std::size_t>{4, 4});
}

TEST_CASE("sigma is 1 for tied and for identity heads") {
  for (const Projection proj : {Projection::learned, Projection::identity}) {
    auto o = head_options(8, 2, 4);
    o.proj = proj;
    o.qk = proj == Projection::learned ? QK::tied : QK::untied;
    Generator gen(6);
    const MultiHeadAttention mha(o, gen);
    for (std::size_t h = 0; h < 2; ++h) {
      const Array<double> A = qk_circuit(mha, h);
      CHECK(std::abs(symmetric_share(A) - 1) < 1e-12);
      CHECK(antisymmetry(A) < 1e-7);  // 2·√(1 − σ): rounding in σ shows as its square root
    }
  }
}

TEST_CASE("the mean sigma of random untied heads is about 0.5 + 1 over 2 d_model") {
  // σ = 1/2 + tr(A²) / (2‖A‖²); for independent zero-mean W_q and W_k, E tr(A²) / E ‖A‖² = 1/d_model.
  for (const std::size_t d_model : {4, 16}) {
    Generator gen(7 + d_model);
    const std::size_t n = 2000;
    double total = 0, total_sq = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const MultiHeadAttention mha(head_options(d_model, 1, 4), gen);
      const double s = symmetric_share(qk_circuit(mha, 0));
      total += s;
      total_sq += s * s;
    }
    const double mean = total / double(n), sd = std::sqrt(total_sq / double(n) - mean * mean);
    const double expected = 0.5 + 1.0 / (2.0 * double(d_model));
    INFO("d_model " << d_model << ": mean " << mean << " ± " << sd / std::sqrt(double(n)));
    CHECK(std::abs(mean - expected) < 4 * sd / std::sqrt(double(n)));  // measured: 0.627 ± 0.0035, 0.5309 ± 0.0010
    // And not the tied value 1, nor the antisymmetric 0.
    CHECK(mean < 0.75);
  }
}

TEST_CASE("softmax-invariant score asymmetry: 0 for symmetric scores and rankings, the cyclic part otherwise") {
  const MaskArray all = xt::ones<bool>(Shape{3, 3});
  // A 3-cycle: S_ij = 1 for j = i + 1, −1 for j = i − 1 (mod 3). S − Sᵀ = 2S has no part a
  // per-query constant can cancel (every row of it sums to 0), so all of it is left: ‖2S‖ over
  // the 6 pairs is √24, and ‖S‖ with rows centred (their mean is 0) is √6: 2.
  const Array<double> cycle = {{0, 1, -1}, {-1, 0, 1}, {1, -1, 0}};
  CHECK(*softmax_invariant_asymmetry(cycle, all) == Approx(2.0).epsilon(1e-12));
  // A ranking, every query preferring the same keys, S_ij = v_j: S − Sᵀ = v_j − v_i, all of it
  // cancelled by c = v (a symmetric S_ij + v_i = v_i + v_j gives the same weights).
  const Array<double> ranking = {{0.5, 2, -1}, {0.5, 2, -1}, {0.5, 2, -1}};
  CHECK(*softmax_invariant_asymmetry(ranking, all) < 1e-12);
  CHECK(antisymmetry(ranking) > 1);  // which ‖S − Sᵀ‖/‖S‖ counts
  // Symmetric scores give 0, and stay 0 with a constant added to each query's row.
  Generator gen(2);
  Array<double> sym = randn({5, 5}, DType::float64, gen).value<double>();
  sym = sym + xt::transpose(sym);
  const MaskArray all5 = xt::ones<bool>(Shape{5, 5});
  CHECK(*softmax_invariant_asymmetry(sym, all5) < 1e-12);
  const Array<double> shifts = xt::view(randn({5}, DType::float64, gen).value<double>(), xt::all(), xt::newaxis());
  CHECK(*softmax_invariant_asymmetry(sym + shifts, all5) < 1e-12);
  // Any S: shifting a query's row changes nothing.
  const Array<double> s = randn({5, 5}, DType::float64, gen).value<double>();
  CHECK(*softmax_invariant_asymmetry(s + shifts, all5) == Approx(*softmax_invariant_asymmetry(s, all5)).epsilon(1e-12));
  // Under a causal mask no pair sees each other both ways: none. With a padding key, its pairs drop.
  MaskArray causal = all;
  causal(0, 1) = causal(0, 2) = causal(1, 2) = false;
  CHECK_FALSE(softmax_invariant_asymmetry(cycle, causal));
  MaskArray padded = all5;
  xt::view(padded, xt::all(), 4) = false;  // key 4 is padding
  Array<double> noisy = sym;
  noisy(1, 4) += 100;  // a score no query may use
  CHECK(*softmax_invariant_asymmetry(noisy, padded) < 1e-12);
  CHECK_THAT(invalid_argument_message([&] { softmax_invariant_asymmetry(cycle, all5); }),
             Contains("softmax_invariant_asymmetry: mask of shape (5,5) for scores of shape (3,3)"));
}

TEST_CASE("composition scores of hand-built heads: Q, K and V") {
  // Writer: W_v = [[1, 0], [0, 0]], W_o = I, so its OV circuit is diag(1, 0): it writes x's first
  // coordinate. Reader: W_q = I, W_k = [[0, 0], [1, 0]] (k_proj.weight is W_kᵀ), so its QK circuit
  // A = W_q W_kᵀ = [[0, 1], [0, 0]]: queries read the first coordinate, keys the second; and its OV
  // circuit is I.
  const auto options = head_options(2, 1, 2);
  MultiHeadAttention writer(options), reader(options);
  const auto set = [](Tensor& w, Array<double> value) { w.copy_(Tensor(std::move(value))); };
  set(writer.v_proj->weight, {{1, 0}, {0, 0}});
  set(writer.out_proj->weight, {{1, 0}, {0, 1}});
  set(reader.q_proj->weight, {{1, 0}, {0, 1}});
  set(reader.k_proj->weight, {{0, 1}, {0, 0}});
  set(reader.v_proj->weight, {{1, 0}, {0, 1}});
  set(reader.out_proj->weight, {{1, 0}, {0, 1}});
  // Q: ‖diag(1,0) A‖ = ‖[[0, 1], [0, 0]]‖ = 1, over ‖diag(1,0)‖ ‖A‖ = 1: the writer's coordinate is
  // the one queries read. K: diag(1,0) Aᵀ = 0: keys read the second coordinate, which it does not
  // write. V: ‖diag(1,0) I‖ / (1 · √2).
  CHECK(composition_score(writer, 0, reader, 0, Composition::q) == Approx(1.0).epsilon(1e-15));
  CHECK(composition_score(writer, 0, reader, 0, Composition::k) == 0.0);
  CHECK(composition_score(writer, 0, reader, 0, Composition::v) == Approx(1 / std::sqrt(2.0)).epsilon(1e-15));
  // Writing the second coordinate instead swaps Q and K.
  set(writer.v_proj->weight, {{0, 0}, {0, 1}});
  CHECK(composition_score(writer, 0, reader, 0, Composition::q) == 0.0);
  CHECK(composition_score(writer, 0, reader, 0, Composition::k) == Approx(1.0).epsilon(1e-15));
  set(writer.v_proj->weight, {{0, 0}, {0, 0}});
  CHECK_THAT(invalid_argument_message([&] { composition_score(writer, 0, reader, 0, Composition::v); }),
             Contains("composition_score: is undefined when a head's circuit is zero"));
}
