#include "tests/helpers.hpp"

#include <xtensor-blas/xlinalg.hpp>

#include "qkv/nn/attention.hpp"
#include "qkv/optim/adam.hpp"

using namespace qkv;
using namespace qkv::nn;
using namespace qkv::test;
using Catch::Matchers::Contains;

namespace {

MultiHeadAttentionOptions options(std::size_t d_model, std::size_t n_heads, std::size_t n_kv_heads = 0) {
  MultiHeadAttentionOptions o;
  o.d_model = d_model;
  o.n_heads = n_heads;
  o.n_kv_heads = n_kv_heads;
  o.dtype = DType::float64;
  return o;
}

Tensor random_input(const Shape& shape, std::uint64_t seed) {
  Generator gen(seed);
  return randn(shape, DType::float64, gen);
}

Array<double> transposed(const Array<double>& a) { return xt::transpose(a); }

// Scores (B, H, T, T) with each head's matrix transposed.
Array<double> transposed_scores(const Tensor& scores) {
  return xt::transpose(scores.value<double>(), {0, 1, 3, 2});
}

}  // namespace

TEST_CASE("seed worked example: one head with the seed's W^Q, W^K, W^V on x1") {
  // ../shared/seeds/004: d_model 4, d_k 2, d_v 3; q = x W^Q, so q_proj.weight (out, in) is W^Qᵀ.
  const Array<double> WQ = {{0.1, 0.4}, {0.2, -0.1}, {-0.3, 0.5}, {0.6, 0.2}};
  const Array<double> WK = {{-0.2, 0.3}, {0.5, 0.1}, {0.4, -0.2}, {-0.1, 0.6}};
  const Array<double> WV = {{0.3, -0.2, 0.5}, {-0.1, 0.4, 0.2}, {0.6, 0.1, -0.3}, {0.2, -0.5, 0.4}};
  auto o = options(4, 1);
  o.d_head = 2;
  o.d_v = 3;
  o.qkv_bias = false;
  o.out_bias = false;
  MultiHeadAttention mha(o);
  mha.q_proj->weight.copy_(f64(transposed(WQ)));
  mha.k_proj->weight.copy_(f64(transposed(WK)));
  mha.v_proj->weight.copy_(f64(transposed(WV)));
  const Tensor x1 = f64({{0.5, -0.3, 0.8, 0.2}});  // one token, unbatched (T=1, d_model)

  check_close(matmul(x1, mha.W_q(0)), {{-0.13, 0.67}});
  check_close(matmul(x1, mha.W_k(0)), {{0.05, 0.08}});
  check_close(matmul(x1, mha.W_v(0)), {{0.70, -0.24, 0.03}});

  // q1·k1 = −0.0065 + 0.0536 = 0.0471, the seed's 0.047, before scaling; 1/√2 after.
  o.scale = 1.0;
  MultiHeadAttention unscaled(o);
  unscaled.load_state_dict(mha.state_dict());
  const double score = unscaled.forward(x1, {}, true).scores.value<double>()(0, 0, 0);
  CHECK(score == Approx(0.0471).margin(1e-12));
  CHECK(std::abs(score - 0.047) < 0.0005);
  const AttentionResult r = mha.forward(x1, {}, true);
  CHECK(r.scores.value<double>()(0, 0, 0) == Approx(0.0471 / std::sqrt(2.0)).margin(1e-12));
  // A single key gets all the weight, so the head's output is v1.
  check_close(r.weights, shaped({1.0}, {1, 1, 1}));
  check_close(r.heads, {{{0.70, -0.24, 0.03}}});
}

TEST_CASE("seed 000: with qk tied the scores are exactly symmetric, untied they are not") {
  const Tensor x = random_input({4, 16}, 0);  // 4 tokens
  auto o = options(16, 1);
  o.d_head = 8;
  o.scale = 1.0;
  o.qk = QK::tied;
  Generator g1(1), g2(1);
  const Array<double> tied = MultiHeadAttention(o, g1).forward(x, {}, true).scores.value<double>();
  CHECK(tied.shape()[1] == 4);
  const Array<double> s = xt::view(tied, 0);
  CHECK(s == transposed(s));
  o.qk = QK::untied;
  const Array<double> untied = xt::view(MultiHeadAttention(o, g2).forward(x, {}, true).scores.value<double>(), 0);
  CHECK(xt::amax(xt::abs(untied - transposed(untied)))() > 0.1);
}

TEST_CASE("seed 001: each row of the weights sums to 1 and a head outputs (T, d_v)") {
  auto o = options(8, 1);
  o.d_head = 4;
  o.d_v = 4;
  MultiHeadAttention mha(o);
  const AttentionResult r = mha.forward(random_input({3, 8}, 2), {}, true);  // T = 3 tokens of 8 numbers
  REQUIRE(r.weights.shape() == Shape{1, 3, 3});
  check_close(sum(r.weights, {-1}), {{1, 1, 1}});
  REQUIRE(r.heads.shape() == Shape{1, 3, 4});  // head 0: (T, d_v)
  CHECK(r.output.shape() == Shape{3, 8});
}

TEST_CASE("the fused path (no weights asked) equals the op-by-op path, forward and backward") {
  MaskArray padding = {{true, true, true, false, true}, {false, true, true, true, true}};
  struct Case {
    const char* name;
    std::size_t heads, kv_heads;
    AttentionMask mask;
    QK qk;
  };
  for (const Case& c : {Case{"causal GQA", 4, 2, {.causal = true}, QK::untied}, Case{"padding", 2, 2, {.key_padding = padding}, QK::untied},
                        Case{"causal+padding MQA", 4, 1, {.causal = true, .key_padding = padding}, QK::untied},
                        Case{"tied, no mask", 2, 2, {}, QK::tied}}) {
    INFO(c.name);
    auto o = options(8, c.heads, c.kv_heads);
    o.qk = c.qk;
    MultiHeadAttention mha(o);
    Tensor x = random_input({2, 5, 8}, 3).requires_grad_();
    const Tensor w = random_input({2, 5, 8}, 4);
    std::vector<Array<double>> grads[2];
    Array<double> outputs[2];
    for (int weights = 0; weights < 2; ++weights) {
      mha.zero_grad();
      x.zero_grad();
      const AttentionResult r = mha.forward(x, c.mask, weights == 1);
      CHECK(r.weights.defined() == (weights == 1));
      sum(r.output * w).backward();
      outputs[weights] = r.output.value<double>();
      grads[weights].push_back(x.grad().value<double>());
      for (const Tensor& p : mha.parameters()) grads[weights].push_back(p.grad().value<double>());
    }
    check_close(outputs[0], outputs[1], 1e-12);
    REQUIRE(grads[0].size() == grads[1].size());
    for (std::size_t i = 0; i < grads[0].size(); ++i) check_close(grads[0][i], grads[1][i], 1e-12);
  }
}

TEST_CASE("each query head reads the kv head of its group, under GQA") {
  auto o = options(8, 4, 2);  // heads 0,1 read kv head 0; heads 2,3 read kv head 1
  o.qkv_bias = false;
  MultiHeadAttention mha(o);
  CHECK(mha.kv_head_of(1) == 0);
  CHECK(mha.kv_head_of(2) == 1);
  CHECK(mha.W_k(0).value<double>() == mha.W_k(1).value<double>());
  CHECK(mha.W_k(1).value<double>() != mha.W_k(2).value<double>());
  const Tensor x = random_input({1, 5, 8}, 4);
  const AttentionResult r = mha.forward(x, {}, true);
  const Tensor x2 = reshape(x, {5, 8});
  for (std::size_t h = 0; h < 4; ++h) {
    INFO("head " << h);
    // score_h = (x W_q(h)) (x W_k(h))ᵀ / √d_head (d_head = 8/4 = 2), head_h = softmax(score_h) (x W_v(h)).
    const Tensor s = matmul(matmul(x2, mha.W_q(h)), transpose(matmul(x2, mha.W_k(h)), 0, 1)) / std::sqrt(2.0);
    check_close(Array<double>(xt::view(r.scores.value<double>(), 0, h)), s.value<double>(), 1e-12);
    check_close(Array<double>(xt::view(r.heads.value<double>(), 0, h)),
                matmul(softmax(s), matmul(x2, mha.W_v(h))).value<double>(), 1e-12);
  }
}

TEST_CASE("cross-attention: Tq differs from Tk and keys and values have their own widths") {
  auto o = options(8, 2);
  o.kdim = 5;
  o.vdim = 6;
  o.d_v = 3;
  MultiHeadAttention mha(o);
  const AttentionResult r = mha.forward(random_input({2, 4, 8}, 5), random_input({2, 7, 5}, 6), random_input({2, 7, 6}, 7),
                                        {}, true);
  CHECK(r.output.shape() == Shape{2, 4, 8});
  CHECK(r.weights.shape() == Shape{2, 2, 4, 7});
  CHECK(r.heads.shape() == Shape{2, 2, 4, 3});
  CHECK(mha.W_o(1).shape() == Shape{3, 8});
  CHECK(mha.W_v(1).shape() == Shape{6, 3});
}

TEST_CASE("decoding one token at a time with a KV cache equals the full causal forward") {
  for (std::size_t kv_heads : {4, 2, 1}) {  // MHA, GQA, MQA
    INFO("n_kv_heads " << kv_heads);
    auto o = options(8, 4, kv_heads);
    o.d_v = 3;
    MultiHeadAttention mha(o);
    const Tensor x = random_input({2, 6, 8}, 8);
    const Array<double> full = mha.forward(x, {.causal = true}).output.value<double>();
    KVCache cache;
    for (std::int64_t t = 0; t < 6; ++t) {
      NoGradGuard no_grad;
      const Tensor step = mha.forward(slice(x, 1, t, t + 1), {.causal = true}, false, &cache).output;
      check_close(step, Array<double>(xt::view(full, xt::all(), xt::range(t, t + 1))), 1e-10);
    }
    // T · n_kv_heads · (d_head + d_v) · sizeof(double) per sequence, for 2 sequences.
    CHECK(cache.length() == 6);
    CHECK(cache.bytes_per_sequence() == 6 * kv_heads * (2 + 3) * 8);
    CHECK(cache.bytes() == 2 * cache.bytes_per_sequence());
    // A step that fails (padding for the wrong number of keys) leaves the cache as it was.
    NoGradGuard no_grad;
    const MaskArray wrong = xt::ones<bool>({std::size_t(2), std::size_t(3)});
    CHECK_THROWS(mha.forward(slice(x, 1, 5, 6), {.causal = true, .key_padding = wrong}, false, &cache));
    CHECK(cache.length() == 6);
  }
}

TEST_CASE("a fully padded sequence gives zero weights and no NaN, forward and backward") {
  MultiHeadAttention mha(options(8, 2));
  Tensor x = random_input({2, 3, 8}, 9);
  x.requires_grad_();
  const MaskArray padding = {{true, true, false}, {false, false, false}};  // sequence 1: all padding
  const AttentionResult r = mha.forward(x, {.causal = true, .key_padding = padding}, true);
  check_close(Array<double>(xt::view(r.weights.value<double>(), 1)), xt::zeros<double>(Shape{2, 3, 3}));
  check_close(Array<double>(xt::view(r.heads.value<double>(), 1)), xt::zeros<double>(Shape{2, 3, 4}));
  for (double v : r.output.value<double>()) CHECK(std::isfinite(v));
  sum(r.output).backward();
  for (const Tensor& p : mha.parameters())
    for (double v : p.grad().value<double>()) CHECK(std::isfinite(v));
  for (double v : x.grad().value<double>()) CHECK(std::isfinite(v));
  check_close(Array<double>(xt::view(x.grad().value<double>(), 1)), xt::zeros<double>(Shape{3, 8}));
}

TEST_CASE("masks combine: causal, key padding and an arbitrary mask") {
  MultiHeadAttention mha(options(8, 2));
  const Tensor x = random_input({1, 3, 8}, 10);
  MaskArray allowed = {{true, true, true}, {false, true, true}, {true, true, true}};  // query 1 skips key 0
  const MaskArray padding = {{true, true, false}};
  const Array<double> w = mha.forward(x, {.causal = true, .key_padding = padding, .allowed = allowed}, true)
                              .weights.value<double>();
  // Query 0 sees key 0 only; query 1 sees key 1 only; query 2 sees keys 0 and 1.
  check_close(Array<double>(xt::view(w, 0, 0)), {{1, 0, 0}, {0, 1, 0}, {w(0, 0, 2, 0), 1 - w(0, 0, 2, 0), 0}});
  CHECK(w(0, 0, 2, 0) > 0);
}

TEST_CASE("frozen projections get no gradient, and a tied model shares one tensor") {
  auto o = options(8, 2);
  o.proj = Projection::frozen;
  MultiHeadAttention frozen(o);
  sum(frozen.forward(random_input({1, 3, 8}, 11)).output).backward();
  for (const auto& [name, p] : frozen.named_parameters()) {
    INFO(name);
    CHECK(p.grad().defined() == (name.rfind("out_proj", 0) == 0));
    CHECK(p.requires_grad() == (name.rfind("out_proj", 0) == 0));
  }
  o.proj = Projection::learned;
  o.qk = QK::tied;
  MultiHeadAttention tied(o);
  CHECK_FALSE(tied.k_proj);
  std::vector<std::string> names;
  for (const auto& [name, p] : tied.state_dict()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"q_proj.weight", "q_proj.bias", "v_proj.weight", "v_proj.bias",
                                          "out_proj.weight", "out_proj.bias"});
  CHECK(tied.W_k(1).value<double>() == tied.W_q(1).value<double>());
}

TEST_CASE("identity heads read their own slice of the stream") {
  auto o = options(6, 3);
  o.proj = Projection::identity;
  MultiHeadAttention mha(o);
  check_close(mha.W_q(1), {{0, 0}, {0, 0}, {1, 0}, {0, 1}, {0, 0}, {0, 0}});
  CHECK(mha.named_parameters().size() == 2);  // out_proj only
}

TEST_CASE("identity-qk heads score with their own slice of the stream and read learned values") {
  MultiHeadAttentionOptions o = options(4, 2);
  o.proj = Projection::identity_qk;
  MultiHeadAttention mha(o);
  std::vector<std::string> names;
  for (const auto& [name, p] : mha.state_dict()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"v_proj.weight", "v_proj.bias", "out_proj.weight", "out_proj.bias"});
  check_close(mha.W_k(1), {{0, 0}, {0, 0}, {1, 0}, {0, 1}});
  // By hand: head h's scores are x_h x_hᵀ / √2 (x_h its two columns), its values x W_vᵀ + b_v.
  const Tensor x = random_input({1, 3, 4}, 8);
  const Array<double> xs = x.value<double>(), wv = mha.v_proj->weight.value<double>(), bv = mha.v_proj->bias.value<double>();
  const Array<double> wo = mha.out_proj->weight.value<double>(), bo = mha.out_proj->bias.value<double>();
  Array<double> v = xt::zeros<double>({3, 4}), z = xt::zeros<double>({3, 4}), expected = xt::zeros<double>({1, 3, 4});
  for (std::size_t t = 0; t < 3; ++t)
    for (std::size_t o2 = 0; o2 < 4; ++o2) {
      v(t, o2) = bv(o2);
      for (std::size_t i = 0; i < 4; ++i) v(t, o2) += xs(0, t, i) * wv(o2, i);
    }
  for (std::size_t h = 0; h < 2; ++h)
    for (std::size_t i = 0; i < 3; ++i) {
      double s[3], total = 0;
      for (std::size_t j = 0; j < 3; ++j) {
        s[j] = (xs(0, i, 2 * h) * xs(0, j, 2 * h) + xs(0, i, 2 * h + 1) * xs(0, j, 2 * h + 1)) / std::sqrt(2.0);
        total += std::exp(s[j]);
      }
      for (std::size_t j = 0; j < 3; ++j)
        for (std::size_t d = 0; d < 2; ++d) z(i, 2 * h + d) += std::exp(s[j]) / total * v(j, 2 * h + d);
    }
  for (std::size_t t = 0; t < 3; ++t)
    for (std::size_t o2 = 0; o2 < 4; ++o2) {
      expected(0, t, o2) = bo(o2);
      for (std::size_t i = 0; i < 4; ++i) expected(0, t, o2) += z(t, i) * wo(o2, i);
    }
  check_close(mha.forward(x).output, expected, 1e-12);
  const AttentionResult r = mha.forward(x, {}, true);
  check_close(r.scores, transposed_scores(r.scores), 1e-12);  // symmetric: x_h x_hᵀ
  o.d_head = 3;
  CHECK(invalid_argument_message([&] { MultiHeadAttention m(o); }) ==
        "MultiHeadAttention: proj=identity-qk needs d_head·n_heads = d_model, got 3·2 = 6 and d_model 4");
}

TEST_CASE("bad configurations and inputs name the option and its values") {
  auto o = options(10, 4);
  CHECK(invalid_argument_message([&] { MultiHeadAttention m(o); }) ==
        "MultiHeadAttention: d_model 10 is not divisible by n_heads 4: give d_head");
  o = options(8, 4, 3);
  CHECK(invalid_argument_message([&] { MultiHeadAttention m(o); }) ==
        "MultiHeadAttention: n_heads 4 is not a multiple of n_kv_heads 3");
  o = options(8, 2);
  o.d_head = 3;
  o.proj = Projection::identity;
  CHECK(invalid_argument_message([&] { MultiHeadAttention m(o); }) ==
        "MultiHeadAttention: proj=identity needs d_head·n_heads = d_model, got 3·2 = 6 and d_model 8");
  MultiHeadAttention mha(options(8, 2));
  CHECK(invalid_argument_message([&] { mha.forward(zeros({2, 3, 7}, DType::float64)); }) ==
        "MultiHeadAttention: input x of shape (2,3,7) must be (B, T, 8) or (T, 8)");
  CHECK_THAT(invalid_argument_message([&] { mha.forward(zeros({1, 2, 3, 8}, DType::float64)); }), Contains("(1,2,3,8)"));
  const Tensor x = zeros({2, 3, 8}, DType::float64);
  CHECK(invalid_argument_message([&] { mha.forward(x, {.key_padding = MaskArray{{true, false, true}}}); }) ==
        "MultiHeadAttention: key_padding mask of shape (1,3) must be (B, Tk) = (2,3)");
  CHECK(invalid_argument_message([&] { mha.forward(x, {.allowed = xt::ones<bool>(Shape{3, 4})}); }) ==
        "MultiHeadAttention: mask of shape (3,4) does not broadcast to (B, H, Tq, Tk) = (2,2,3,3)");
}

TEST_CASE("an optimizer never changes frozen projections") {
  auto o = options(8, 2);
  o.proj = Projection::frozen;
  MultiHeadAttention mha(o);
  StateDict before;
  for (const auto& [name, p] : mha.state_dict()) before.emplace_back(name, p.detach().to(p.dtype()));
  optim::Adam opt(mha.parameters(), {.lr = 0.1});
  const Tensor x = random_input({2, 3, 8}, 12);
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    sum(pow(mha.forward(x, {.causal = true}).output, 2.0)).backward();
    opt.step();
  }
  const StateDict after = mha.state_dict();
  for (std::size_t i = 0; i < after.size(); ++i) {
    INFO(after[i].first);
    const bool trained = after[i].first.rfind("out_proj", 0) == 0;
    CHECK((after[i].second.value<double>() == before[i].second.value<double>()) == !trained);
  }
}

TEST_CASE("QK symmetric: k = q times a fixed sign vector, scores exactly symmetric and indefinite") {
  auto o = options(8, 2);  // d_head 4: s = (+1, +1, -1, -1) in each head
  o.qk = QK::symmetric;
  Generator gen(11);
  MultiHeadAttention mha(o, gen);
  CHECK_FALSE(mha.k_proj);
  CHECK(mha.parameters().size() == 6);  // q, v, out: weight and bias each
  check_close(mha.key_signs(DType::float64).value<double>(), {1, 1, -1, -1, 1, 1, -1, -1});
  const Tensor x = random_input({1, 5, 8}, 12);
  const AttentionResult r = mha.forward(x, {}, true);
  const Tensor x2 = reshape(x, {5, 8});
  for (std::size_t h = 0; h < 2; ++h) {
    INFO("head " << h);
    // W_k(h) = W_q(h) diag(1, 1, -1, -1); the bias of k is the bias of q times s likewise.
    Array<double> wk = mha.W_q(h).value<double>();
    xt::view(wk, xt::all(), xt::range(2, 4)) *= -1.0;
    check_close(mha.W_k(h), wk, 0);
    const Array<double> s = xt::view(r.scores.value<double>(), 0, h);
    CHECK(xt::amax(xt::abs(s - transposed(s)))() < 1e-12);  // symmetric
    // Indefinite: the QK circuit A = W_q diag(s) W_qᵀ has eigenvalues of both signs (a tied
    // head's A = W_q W_qᵀ has none below 0).
    const Array<double> a = matmul(mha.W_q(h), transpose(mha.W_k(h), 0, 1)).value<double>();
    const auto [values, vectors] = xt::linalg::eigh(a);
    CHECK(xt::amin(values)() < -1e-3);
    CHECK(xt::amax(values)() > 1e-3);
  }
  // The fused path (one GEMM over [W_q; W_q diag(s); W_v]) gives the op-by-op result, and the
  // gradient reaches q_proj alone.
  Tensor xg = random_input({2, 5, 8}, 13);
  xg.requires_grad_();
  const Tensor fused = mha.forward(xg, {.causal = true}).output, slow = mha.forward(xg, {.causal = true}, true).output;
  check_close(fused, slow.value<double>(), 1e-12);
  sum(fused * fused).backward();
  CHECK(mha.q_proj->weight.grad().defined());
  // With tied keys, the same weights give a positive semi-definite A.
  o.qk = QK::tied;
  Generator same(11);
  const MultiHeadAttention tied(o, same);
  const Array<double> gram = matmul(tied.W_q(0), transpose(tied.W_k(0), 0, 1)).value<double>();
  CHECK(xt::amin(std::get<0>(xt::linalg::eigh(gram)))() > -1e-12);
  // With d_head 1 there is no −1 to make: it would be a tied head, and is refused.
  o.qk = QK::symmetric;
  o.d_head = 1;
  CHECK_THAT(invalid_argument_message([&] { MultiHeadAttention{o}; }),
             Contains("qk=symmetric needs d_head of at least 2"));
}

TEST_CASE("a KV cache appends in place, and a copy of it is a snapshot the other's appends never change") {
  Generator gen(21);
  const Tensor k = randn({2, 40, 6}, DType::float64, gen), v = randn({2, 40, 4}, DType::float64, gen);
  const auto rows = [](const Tensor& t, std::int64_t from, std::int64_t to) { return slice(t, 1, from, to); };
  const auto data = [](const KVCache& c) { return c.key_buffer().value<double>().data(); };
  KVCache cache;
  CHECK(cache.length() == 0);
  CHECK_FALSE(cache.keys().defined());
  cache.append(rows(k, 0, 3), rows(v, 0, 3));
  CHECK(cache.capacity_bytes() == cache.bytes());  // a first append takes the room it needs
  for (std::int64_t t = 3; t < 10; ++t) cache.append(rows(k, t, t + 1), rows(v, t, t + 1));  // then doubles: 6, 12
  const double* before = data(cache);
  cache.append(rows(k, 10, 12), rows(v, 10, 12));
  CHECK(data(cache) == before);  // room left: in place
  CHECK(cache.capacity_bytes() == cache.bytes());  // 12 of 12 rows
  cache.append(rows(k, 12, 13), rows(v, 12, 13));  // grows to 24
  const KVCache snapshot = cache;
  // The two copies go different ways: the cache appends in place, past what the snapshot holds;
  // the snapshot's own append then cannot write there, and copies.
  cache.append(rows(k, 13, 14), rows(v, 13, 14));
  CHECK(data(cache) == data(snapshot));
  KVCache other = snapshot;
  other.append(rows(k, 0, 1) * 0.0 + 7.0, rows(v, 0, 1) * 0.0 - 1.0);
  CHECK(data(other) != data(cache));
  cache.append(rows(k, 14, 40), rows(v, 14, 40));
  CHECK(cache.length() == 40);
  CHECK(snapshot.length() == 13);
  CHECK(other.length() == 14);
  check_close(cache.keys(), k.value<double>(), 0);
  check_close(cache.values(), v.value<double>(), 0);
  check_close(snapshot.keys(), Array<double>(xt::view(k.value<double>(), xt::all(), xt::range(0, 13), xt::all())), 0);
  const Array<double> mine = other.keys().value<double>();
  CHECK(xt::all(xt::equal(xt::view(mine, xt::all(), 13, xt::all()), 7.0)));
  check_close(Tensor(Array<double>(xt::view(mine, xt::all(), xt::range(0, 13), xt::all()))),
              Array<double>(xt::view(k.value<double>(), xt::all(), xt::range(0, 13), xt::all())), 0);
  CHECK(cache.bytes() == 2 * 40 * (6 + 4) * 8);
  CHECK(cache.capacity_bytes() == 2 * 48 * (6 + 4) * 8);
  // Keys of another width, or for other sequences, are named.
  CHECK_THROWS_WITH(cache.append(slice(rows(k, 0, 1), 2, 0, 5), rows(v, 0, 1)),
                    Contains("the cache holds keys of shape (B, T, ·) = (2,40,6) and values of width 4 in float64; this "
                             "call appends (2,1,5) and 4 in float64"));
  cache.clear();
  CHECK(cache.length() == 0);
  CHECK(cache.bytes() == 0);
}

TEST_CASE("a step with a KV cache and gradients on passes them to its new position's keys and values") {
  MultiHeadAttention mha(options(8, 2));
  const Tensor x = random_input({2, 4, 8}, 41);
  KVCache prefilled;
  {
    NoGradGuard no_grad;
    mha.forward(slice(x, 1, 0, 3), {.causal = true}, false, &prefilled);
  }
  Tensor last = slice(x, 1, 3, 4).detach();
  last.requires_grad_();
  check_gradients([&](const std::vector<Tensor>& in) {
    KVCache cache = prefilled;  // a snapshot: every evaluation starts from the same three positions
    return mha.forward(in[0], {.causal = true}, false, &cache).output;
  }, {last});
}

TEST_CASE("decoding with weights or hooks, op by op, and without, in the fused kernel, agree and fill the same cache") {
  for (const auto& [qk, proj, kv_heads] : {std::tuple{QK::untied, Projection::learned, 2}, {QK::tied, Projection::learned, 4},
                                           {QK::symmetric, Projection::learned, 4}, {QK::untied, Projection::identity, 4},
                                           {QK::untied, Projection::identity_qk, 4}}) {
    INFO("qk " << int(qk) << ", proj " << int(proj));
    auto o = options(8, 4, std::size_t(kv_heads));
    o.qk = qk;
    o.proj = proj;
    MultiHeadAttention mha(o);
    const Tensor x = random_input({2, 5, 8}, 31);
    const AttentionResult full = mha.forward(x, {.causal = true}, true);
    KVCache fused, op_by_op;
    NoGradGuard no_grad;
    for (std::int64_t t = 0; t < 5; ++t) {
      const Tensor step = slice(x, 1, t, t + 1);
      const Tensor a = mha.forward(step, {.causal = true}, false, &fused).output;
      const AttentionResult b = mha.forward(step, {.causal = true}, true, &op_by_op);
      check_close(a, b.output.value<double>(), 1e-12);
      check_close(a, Array<double>(xt::view(full.output.value<double>(), xt::all(), xt::range(t, t + 1), xt::all())), 1e-12);
      check_close(b.weights, Array<double>(xt::view(full.weights.value<double>(), xt::all(), xt::all(), xt::range(t, t + 1),
                                                    xt::range(0, t + 1))), 1e-12);
    }
    check_close(fused.keys(), op_by_op.keys().value<double>(), 0);
    check_close(fused.values(), op_by_op.values().value<double>(), 0);
  }
}
