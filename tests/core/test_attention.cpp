#include "tests/helpers.hpp"

#include <limits>
#include <tuple>
#include <vector>

#include "qkv/core/autograd.hpp"
#include "qkv/core/detail/attention.hpp"
#include "qkv/core/runtime.hpp"

using namespace qkv;
using namespace qkv::test;
using Catch::Matchers::Contains;

namespace {

// softmax(scale · q kᵀ) v by loops in double, heads packed in the last dimension: the reference.
Array<double> reference(const Array<double>& q, const Array<double>& k, const Array<double>& v, std::size_t H,
                        std::size_t Hkv, double scale, bool causal, const MaskArray& allowed = MaskArray()) {
  const std::size_t B = q.shape()[0], Tq = q.shape()[1], Tk = k.shape()[1], dh = q.shape()[2] / H,
                    dv = v.shape()[2] / Hkv;
  Array<double> out = xt::zeros<double>(Shape{B, Tq, H * dv});
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h) {
      const std::size_t kv = h / (H / Hkv);
      for (std::size_t i = 0; i < Tq; ++i) {
        std::vector<double> s(Tk, -std::numeric_limits<double>::infinity());
        double m = -std::numeric_limits<double>::infinity();
        for (std::size_t j = 0; j < Tk; ++j) {
          if (causal && j + Tq > Tk + i) continue;  // j > Tk − Tq + i
          if (allowed.dimension() > 0 && !allowed(b, h, i, j)) continue;
          double dot = 0;
          for (std::size_t d = 0; d < dh; ++d) dot += q(b, i, h * dh + d) * k(b, j, kv * dh + d);
          s[j] = scale * dot;
          m = std::max(m, s[j]);
        }
        if (m == -std::numeric_limits<double>::infinity()) continue;  // no key: zeros
        double total = 0;
        for (double& x : s) total += x = std::exp(x - m);
        for (std::size_t j = 0; j < Tk; ++j)
          for (std::size_t d = 0; d < dv; ++d) out(b, i, h * dv + d) += s[j] / total * v(b, j, kv * dv + d);
      }
    }
  return out;
}

Tensor random_input(const Shape& shape, Generator& gen, bool grad = true) {
  Tensor t = randn(shape, DType::float64, gen);
  t.requires_grad_(grad);
  return t;
}

}  // namespace

TEST_CASE("scaled_dot_product_attention against hand-computed values") {
  // One head, two queries, two keys, d = 1. Query 0 scores the keys 1·1 = 1 and 1·0 = 0, so its
  // weights are e/(1+e) and 1/(1+e) on the values 10 and 20; under the causal mask it sees key 0
  // only and returns 10. Query 1 (q = 0) scores both keys 0 and returns the mean, 15.
  const Tensor q = f64(shaped({1, 0}, {1, 2, 1})), k = f64(shaped({1, 0}, {1, 2, 1})), v = f64(shaped({10, 20}, {1, 2, 1}));
  const double e = std::exp(1.0);
  check_close(scaled_dot_product_attention(q, k, v, 1, 1, 1.0, false), shaped({10 * e / (1 + e) + 20 / (1 + e), 15}, {1, 2, 1}));
  check_close(scaled_dot_product_attention(q, k, v, 1, 1, 1.0, true), shaped({10, 15}, {1, 2, 1}));
  // The scale multiplies the scores: at scale 0 every query averages.
  check_close(scaled_dot_product_attention(q, k, v, 1, 1, 0.0, false), shaped({15, 15}, {1, 2, 1}));
}

TEST_CASE("scaled_dot_product_attention equals a loop reference, with heads, GQA, MQA, causal and masks") {
  Generator gen(3);
  struct Case {
    std::size_t Tq, Tk, H, Hkv, dh, dv;
    bool causal, masked;
  };
  // Up to 64 keys the weights are one tile per head, kept for backward; past that, tiles of 64 × 64
  // with the online softmax, computed again in backward: 70 queries make two tiles, the last of 6;
  // 66 queries against 130 keys put the causal diagonal along tiles' diagonals 64 keys on, 70
  // against 130 across tiles (60 on); 70 queries against 66 keys, and a single query with a
  // gradient, are tiles too. Causal with more queries than keys: the first Tq − Tk queries see
  // nothing, in one tile (6 against 4) and in tiles (150 against 70: the first block of 64 queries
  // sees nothing, the second partly). Kept weights with more queries than a tile and two query heads
  // a kv head (100 against 40): the second head's dK and dV add to the first's.
  for (const Case c : {Case{5, 5, 2, 2, 3, 3, false, false}, Case{5, 5, 4, 2, 3, 2, true, false},
                       Case{3, 6, 3, 1, 4, 2, true, false}, Case{4, 3, 2, 1, 2, 5, false, true},
                       Case{6, 6, 4, 4, 1, 1, true, true}, Case{70, 70, 2, 1, 1, 1, true, false},
                       Case{66, 130, 2, 2, 1, 2, true, true}, Case{70, 130, 2, 1, 1, 2, true, true},
                       Case{68, 72, 4, 2, 1, 1, false, true}, Case{70, 66, 2, 1, 1, 1, false, false},
                       Case{1, 100, 2, 1, 2, 2, false, false}, Case{6, 4, 2, 1, 3, 2, true, false},
                       Case{6, 4, 2, 2, 2, 2, true, true}, Case{150, 70, 2, 1, 1, 2, true, false},
                       Case{100, 40, 4, 2, 2, 3, false, false}, Case{100, 40, 4, 2, 2, 3, true, true}}) {
    INFO("Tq " << c.Tq << " Tk " << c.Tk << " H " << c.H << " Hkv " << c.Hkv << " causal " << c.causal << " masked " << c.masked);
    const Tensor q = random_input({2, c.Tq, c.H * c.dh}, gen), k = random_input({2, c.Tk, c.Hkv * c.dh}, gen),
                 v = random_input({2, c.Tk, c.Hkv * c.dv}, gen);
    MaskArray allowed;
    if (c.masked) {
      allowed = xt::ones<bool>(Shape{2, c.H, c.Tq, c.Tk});
      for (std::size_t j = 0; j < c.Tk; ++j) allowed(1, c.H - 1, 0, j) = false;  // a query that sees nothing
      allowed(0, 0, 1, 0) = false;
      // Past one tile: a query that sees nothing in the first tile of keys (its running maximum
      // stays −inf until the second), and one that sees nothing after the first.
      for (std::size_t j = 0; j < std::min<std::size_t>(64, c.Tk); ++j) allowed(0, 1, 2, j) = false;
      for (std::size_t j = 64; j < c.Tk; ++j) allowed(1, 0, c.Tq - 1, j) = false;
    }
    const Tensor y = scaled_dot_product_attention(q, k, v, c.H, c.Hkv, 0.7, c.causal, allowed);
    check_close(y, reference(q.value<double>(), k.value<double>(), v.value<double>(), c.H, c.Hkv, 0.7, c.causal, allowed));
    check_gradients([&](const std::vector<Tensor>& x) {
      return scaled_dot_product_attention(x[0], x[1], x[2], c.H, c.Hkv, 0.7, c.causal, allowed);
    }, {q, k, v});
  }
}

TEST_CASE("scaled_dot_product_attention on packed qkv equals it on q, k and v apart") {
  for (const std::size_t T : {5, 70}) {  // one tile; tiles
    INFO("T " << T);
    Generator gen(6);
    const std::size_t H = 4, Hkv = 2, dh = 3, dv = 2, width = H * dh + Hkv * (dh + dv);
    const Tensor qkv = random_input({2, T, width}, gen);
    const auto part = [&](std::size_t from, std::size_t to) { return slice(qkv, -1, std::int64_t(from), std::int64_t(to)); };
    const Tensor w = random_input({2, T, H * dv}, gen, false);
    const Tensor packed = scaled_dot_product_attention(qkv, H, Hkv, dh, dv, 0.6, true);
    sum(packed * w).backward();
    const Array<double> packed_grad = qkv.grad().value<double>();
    qkv.grad().mutable_value<double>().fill(0);
    const Tensor apart = scaled_dot_product_attention(part(0, H * dh), part(H * dh, (H + Hkv) * dh), part((H + Hkv) * dh, width),
                                                      H, Hkv, 0.6, true);
    check_close(packed, apart.value<double>(), 1e-15);
    sum(apart * w).backward();
    check_close(qkv.grad(), packed_grad, 1e-15);
  }
  Generator gen(6);
  const Tensor qkv = random_input({2, 5, 22}, gen);
  CHECK_THAT(invalid_argument_message([&] { scaled_dot_product_attention(qkv, 4, 2, 3, 3, 0.6, true); }),
             Contains("packed qkv of shape (2,5,22) must be (B, T, H·d_head + Hkv·(d_head + d_v)) = (B, T, 4·3 + 2·(3 + 3))"));
}

TEST_CASE("scaled_dot_product_attention in float32 matches float64, and a query with no key gives zeros") {
  Generator gen(4);
  const Tensor q = random_input({2, 4, 6}, gen, false), k = random_input({2, 4, 6}, gen, false),
               v = random_input({2, 4, 6}, gen, false);
  MaskArray allowed = xt::ones<bool>(Shape{2, 2, 4, 4});
  for (std::size_t j = 0; j < 4; ++j) allowed(0, 1, 2, j) = false;
  const Tensor y64 = scaled_dot_product_attention(q, k, v, 2, 2, 0.5, true, allowed);
  const Tensor y32 = scaled_dot_product_attention(q.to(DType::float32), k.to(DType::float32), v.to(DType::float32), 2, 2,
                                                  0.5, true, allowed);
  check_close(y32, y64.value<double>(), 1e-5);
  for (std::size_t d = 3; d < 6; ++d) CHECK(y64.value<double>()(0, 2, d) == 0);  // head 1 of batch 0, query 2
}

TEST_CASE("scaled_dot_product_attention, causal with more queries than keys: query i sees keys up to Tk − Tq + i, and those that see none get zeros and pass no gradient") {
  // 7 queries against 4 keys (one tile), 200 against 70 (tiles: queries 0-129 see nothing, the
  // first two blocks of 64 wholly); float64 and float32.
  for (const auto& [Tq, Tk] : {std::pair<std::size_t, std::size_t>{7, 4}, {200, 70}}) {
    for (const DType dtype : {DType::float64, DType::float32}) {
      INFO("Tq " << Tq << ", Tk " << Tk << ", " << dtype_name(dtype));
      Generator gen(Tq);
      const auto input = [&](const Shape& shape) { return randn(shape, DType::float64, gen).to(dtype).detach().requires_grad_(); };
      const Tensor q = input({2, Tq, 8}), k = input({2, Tk, 4}), v = input({2, Tk, 4});
      const Tensor y = scaled_dot_product_attention(q, k, v, 2, 1, 0.5, true);
      const auto in64 = [](const Tensor& t) { return t.to(DType::float64).value<double>(); };
      check_close(y, reference(in64(q), in64(k), in64(v), 2, 1, 0.5, true), dtype == DType::float64 ? 1e-13 : 2e-6);
      sum(y * y).backward();
      const Array<double> out = in64(y), dq = in64(q.grad());
      for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t i = 0; i < Tq; ++i)
          for (std::size_t e = 0; e < 8; ++e) {
            INFO("b " << b << ", query " << i << ", " << e);
            if (i < Tq - Tk) {
              CHECK(out(b, i, e) == 0);
              CHECK(dq(b, i, e) == 0);
            }
            // Query Tq − Tk sees key 0 alone, with weight 1 whatever its q: its dq is 0 too.
            if (i > Tq - Tk) CHECK(dq(b, i, e) != 0);
          }
    }
  }
}

TEST_CASE("scaled_dot_product_attention's float32 kernels match float64, values and gradients, on padded rows and tiles, with masks") {
  // 19 and 33 keys: rows padded past the keys to whole chunks of 16; causal rows end inside a chunk.
  // 150 and 200 keys: tiles, the last ones cut short; masks hiding scattered keys, a query's whole
  // first tile and a query's every key.
  for (const auto& [Tq, Tk, causal, masked] : std::vector<std::tuple<std::size_t, std::size_t, bool, bool>>{
           {19, 19, true, false}, {19, 33, true, true}, {19, 33, false, false}, {16, 16, true, false},
           {150, 150, true, false}, {70, 200, true, true}, {130, 100, false, true}}) {
    INFO("Tq " << Tq << ", Tk " << Tk << ", causal " << causal << ", masked " << masked);
    Generator gen(Tq + Tk);
    const Tensor q = random_input({2, Tq, 12}, gen), k = random_input({2, Tk, 6}, gen), v = random_input({2, Tk, 10}, gen);
    const Tensor w = randn({2, Tq, 20}, DType::float64, gen);
    MaskArray allowed;
    if (masked) {
      allowed = xt::ones<bool>(Shape{2, 4, Tq, Tk});
      for (std::size_t i = 0; i < allowed.size(); i += 7) allowed.data()[i] = false;
      for (std::size_t j = 0; j < std::min<std::size_t>(64, Tk); ++j) allowed(0, 2, Tq - 1, j) = false;
      for (std::size_t j = 0; j < Tk; ++j) allowed(1, 3, Tq / 2, j) = false;
    }
    const Tensor y64 = scaled_dot_product_attention(q, k, v, 4, 2, 0.7, causal, allowed);
    check_close(y64, reference(q.value<double>(), k.value<double>(), v.value<double>(), 4, 2, 0.7, causal, allowed), 1e-13);
    sum(y64 * w).backward();
    const auto as32 = [](const Tensor& t) { return t.to(DType::float32).detach().requires_grad_(); };
    const Tensor q32 = as32(q), k32 = as32(k), v32 = as32(v);
    const Tensor y32 = scaled_dot_product_attention(q32, k32, v32, 4, 2, 0.7, causal, allowed);
    sum(y32 * w.to(DType::float32)).backward();
    check_close(y32, y64.value<double>(), 2e-6);
    check_close(q32.grad(), q.grad().value<double>(), 1e-5);
    check_close(k32.grad(), k.grad().value<double>(), 1e-5);
    check_close(v32.grad(), v.grad().value<double>(), 1e-5);
  }
}

TEST_CASE("scaled_dot_product_attention gives bit-identical results and gradients on 1 and 2 threads") {
  for (const std::size_t T : {16, 150}) {  // weights kept; tiles
    INFO("T " << T);
    Generator gen(5);
    const Tensor q = random_input({3, T, 32}, gen).to(DType::float32).detach().requires_grad_(),
                 k = random_input({3, T, 16}, gen).to(DType::float32).detach().requires_grad_(),
                 v = random_input({3, T, 16}, gen).to(DType::float32).detach().requires_grad_();
    const Tensor w = randn({3, T, 32}, DType::float32, gen);
    std::vector<Array<float>> results;
    for (std::size_t threads : {1, 2}) {
      set_num_threads(threads);
      for (Tensor t : {q, k, v}) t.zero_grad();
      const Tensor y = scaled_dot_product_attention(q, k, v, 4, 2, 0.25, true);
      sum(y * w).backward();
      results.push_back(y.value<float>());
      for (const Tensor& t : {q, k, v}) results.push_back(t.grad().value<float>());
    }
    set_num_threads(1);
    for (std::size_t i = 0; i < 4; ++i) CHECK(bool(results[i] == results[i + 4]));
  }
}

TEST_CASE("scaled_dot_product_attention rejects bad shapes, naming them") {
  const Tensor q = zeros({2, 3, 8}, DType::float64), k = zeros({2, 5, 8}, DType::float64), v = zeros({2, 5, 4}, DType::float64);
  CHECK_THAT(invalid_argument_message([&] { scaled_dot_product_attention(q, k, v, 3, 3, 1, false); }),
             Contains("scaled_dot_product_attention") && Contains("q (2,3,8)") && Contains("3 query heads"));
  CHECK_THAT(invalid_argument_message([&] { scaled_dot_product_attention(q, k, v, 4, 3, 1, false); }),
             Contains("4 heads and 3 kv heads"));
  CHECK_THAT(invalid_argument_message([&] { scaled_dot_product_attention(q, zeros({2, 5, 4}, DType::float64), v, 2, 2, 1, false); }),
             Contains("queries have 4 features per head and keys 2"));
  CHECK_THAT(invalid_argument_message([&] { scaled_dot_product_attention(q, k, zeros({2, 4, 4}, DType::float64), 2, 2, 1, false); }),
             Contains("one batch size, and keys and values of one length"));
  CHECK_THAT(invalid_argument_message([&] { scaled_dot_product_attention(q, k, v, 2, 2, 1, false, MaskArray(xt::ones<bool>(Shape{2, 3, 5}))); }),
             Contains("mask of shape (2,3,5) must be (B, H, Tq, Tk) = (2,2,3,5)"));
  CHECK_THAT(invalid_argument_message([&] { scaled_dot_product_attention(q, k, v.to(DType::float32), 2, 2, 1, false); }),
             Contains("scaled_dot_product_attention"));
}

TEST_CASE("cached_attention reads keys and values in place from buffers with room, as the reference attends them") {
  Generator gen(12);
  const std::size_t B = 2, H = 4, Hkv = 2, dh = 3, dv = 2;
  // 7 keys: one tile; 130 keys and 128 queries: tiles, batch entries 150 rows apart.
  for (const auto& [capacity, length] : std::vector<std::pair<std::size_t, std::size_t>>{{9, 7}, {150, 130}}) {
    for (DType dtype : {DType::float64, DType::float32}) {
      for (std::size_t Tq : {std::size_t(1), std::size_t(3), length - 2}) {
        for (bool masked : {false, true}) {
          const std::size_t Tk = length;
          INFO(dtype_name(dtype) << " length " << length << " Tq " << Tq << " masked " << masked);
          // Rows past `length` of the buffers hold junk.
          const Tensor wide = random_input({B, Tq, H * dh}, gen, false);
          const Tensor keys = random_input({B, capacity, Hkv * dh}, gen, false), values = random_input({B, capacity, Hkv * dv}, gen, false);
          MaskArray allowed;
          if (masked) {
            allowed = xt::ones<bool>(Shape{B, H, Tq, Tk});
            allowed(1, 2, 0, 3) = false;
            for (std::size_t j = 0; j < Tk; ++j) allowed(0, 1, Tq - 1, j) = false;  // a query that sees nothing
          }
          NoGradGuard no_grad;
          const Tensor y = detail::cached_attention(wide.to(dtype), keys.to(dtype), values.to(dtype), length, H, Hkv, 0.6,
                                                    true, allowed);
          const Array<double> q = wide.value<double>();
          const Array<double> k = xt::view(keys.value<double>(), xt::all(), xt::range(0, length), xt::all());
          const Array<double> v = xt::view(values.value<double>(), xt::all(), xt::range(0, length), xt::all());
          check_close(y.to(DType::float64), reference(q, k, v, H, Hkv, 0.6, true, allowed), dtype == DType::float64 ? 1e-12 : 1e-5);
        }
      }
    }
  }
  const Tensor q = random_input({1, 1, 4}, gen), kv = random_input({1, 5, 4}, gen, false);
  CHECK_THAT(invalid_argument_message([&] { detail::cached_attention(q, kv, kv, 3, 2, 2, 1.0, true, MaskArray()); }),
             Contains("attention against a KV cache is forward only"));
  NoGradGuard no_grad;
  CHECK_THAT(invalid_argument_message([&] { detail::cached_attention(q, kv, kv, 6, 2, 2, 1.0, true, MaskArray()); }),
             Contains("against 6 cached keys of (1,5,4)"));
}
