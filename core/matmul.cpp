// matmul: (..., n, k) @ (..., k, m) -> (..., n, m), every product through BLAS gemm; linear, with
// small layers in blocks through SmallGemm.
#include <algorithm>
#include <climits>

#include "qkv/core/detail/blas.hpp"
#include "qkv/core/detail/kernels.hpp"
#include "qkv/core/detail/op.hpp"
#include "qkv/core/ops.hpp"

namespace qkv {

namespace {

// Row-major C (M,N) = op(A) (M,K) · op(B) (K,N) + beta C, each operand contiguous.
template <class T>
void gemm(bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, const T* A, const T* B, T beta,
          T* C) {
  detail::gemm(trans_a, trans_b, M, N, K, T(1), A, trans_a ? M : K, B, trans_b ? K : N, beta, C, N);
}

// Element offsets of each batch entry of an operand whose batch dimensions `in` broadcast to
// `out`, for matrices of `matrix_size` elements. Broadcast dimensions repeat an offset.
std::vector<std::size_t> batch_offsets(const Shape& in, const Shape& out, std::size_t matrix_size) {
  const std::size_t lead = out.size() - in.size();
  std::vector<std::size_t> strides(out.size(), 0);
  std::size_t stride = matrix_size;
  for (std::size_t d = in.size(); d-- > 0;) {
    strides[d + lead] = in[d] == 1 ? 0 : stride;
    stride *= in[d];
  }
  std::vector<std::size_t> offsets(numel(out));
  std::vector<std::size_t> index(out.size(), 0);
  for (std::size_t i = 0; i < offsets.size(); ++i) {
    std::size_t off = 0;
    for (std::size_t d = 0; d < out.size(); ++d) off += index[d] * strides[d];
    offsets[i] = off;
    for (std::size_t d = out.size(); d-- > 0;) {  // next multi-index, row-major
      if (++index[d] < out[d]) break;
      index[d] = 0;
    }
  }
  return offsets;
}

// The batch layout of one product, shared by forward and backward.
struct Plan {
  std::size_t n, k, m;
  Shape batch;                          // broadcast batch dimensions of the output
  std::vector<std::size_t> a_off, b_off;  // per output batch entry
  bool fold;  // b has no batch: a's batch folds into the rows of one gemm
};

Plan plan_for(const Shape& sa, const Shape& sb) {
  Plan p;
  p.n = sa[sa.size() - 2];
  p.k = sa.back();
  p.m = sb.back();
  const Shape batch_a(sa.begin(), sa.end() - 2), batch_b(sb.begin(), sb.end() - 2);
  const auto batch = try_broadcast_shapes(batch_a, batch_b);
  if (!batch)
    fail("matmul", "{} @ {}: batch dimensions {} and {} cannot broadcast", to_string(sa), to_string(sb),
         to_string(batch_a), to_string(batch_b));
  p.batch = *batch;
  p.fold = numel(batch_b) == 1;
  if (!p.fold) {
    p.a_off = batch_offsets(batch_a, p.batch, p.n * p.k);
    p.b_off = batch_offsets(batch_b, p.batch, p.k * p.m);
  }
  return p;
}

template <class T>
Tensor matmul_nd(const Tensor& a, const Tensor& b) {
  const Shape sa = a.shape(), sb = b.shape();
  const Plan p = plan_for(sa, sb);
  Shape out_shape = p.batch;
  out_shape.push_back(p.n);
  out_shape.push_back(p.m);
  Array<T> y = Array<T>::from_shape(out_shape);
  const T* A = a.value<T>().data();
  const T* B = b.value<T>().data();
  const std::size_t batches = numel(p.batch);
  if (p.fold) {
    gemm(false, false, batches * p.n, p.m, p.k, A, B, T(0), y.data());
  } else {
    for (std::size_t i = 0; i < batches; ++i)
      gemm(false, false, p.n, p.m, p.k, A + p.a_off[i], B + p.b_off[i], T(0), y.data() + i * p.n * p.m);
  }
  return record_op<T>("matmul", std::move(y), {&a, &b}, [a, b, p, sa, sb](BackwardContext<T>& ctx) {
    // forward was Y_i = A_i B_i, so dA_i += dY_i B_iᵀ and dB_i += A_iᵀ dY_i; a broadcast operand
    // gets the sum over the batch entries that shared it (gemm with beta = 1).
    const T* G = ctx.grad().data();
    const T* A = a.value<T>().data();
    const T* B = b.value<T>().data();
    const std::size_t batches = numel(p.batch);
    if (ctx.needs(0)) {
      Array<T> ga = Array<T>::from_shape(sa);
      if (p.fold) {
        gemm(false, true, batches * p.n, p.k, p.m, G, B, T(0), ga.data());
      } else {
        ga.fill(T(0));
        for (std::size_t i = 0; i < batches; ++i)
          gemm(false, true, p.n, p.k, p.m, G + i * p.n * p.m, B + p.b_off[i], T(1), ga.data() + p.a_off[i]);
      }
      ctx.accumulate(0, std::move(ga));
    }
    if (ctx.needs(1)) {
      Array<T> gb = Array<T>::from_shape(sb);
      if (p.fold) {
        gemm(true, false, p.k, p.m, batches * p.n, A, G, T(0), gb.data());
      } else {
        gb.fill(T(0));
        for (std::size_t i = 0; i < batches; ++i)
          gemm(true, false, p.k, p.m, p.n, A + p.a_off[i], G + i * p.n * p.m, T(1), gb.data() + p.b_off[i]);
      }
      ctx.accumulate(1, std::move(gb));
    }
  });
}

std::vector<std::int64_t> signed_shape(const Shape& s) { return std::vector<std::int64_t>(s.begin(), s.end()); }

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_inputs("matmul", {&a, &b});
  const Shape sa = a.shape(), sb = b.shape();
  if (sa.empty() || sb.empty())
    fail("matmul", "{} @ {}: both operands need at least one dimension", to_string(sa), to_string(sb));
  const std::size_t k_a = sa.back(), k_b = sb.size() == 1 ? sb[0] : sb[sb.size() - 2];
  if (k_a != k_b)
    fail("matmul", "{} @ {}: inner dimensions {} and {} differ", to_string(sa), to_string(sb), k_a, k_b);
  for (const Shape* s : {&sa, &sb})
    if (numel(*s) > static_cast<std::size_t>(INT_MAX))
      fail("matmul", "{} @ {}: an operand exceeds BLAS's int range", to_string(sa), to_string(sb));
  // A 1-D operand is a row (left) or column (right) vector whose dimension the result drops.
  const bool a_vector = sa.size() == 1, b_vector = sb.size() == 1;
  if (a_vector || b_vector) {
    const Tensor y = matmul(a_vector ? reshape(a, {1, std::int64_t(k_a)}) : a,
                            b_vector ? reshape(b, {std::int64_t(k_b), 1}) : b);
    Shape s = y.shape();  // (..., n, m)
    if (b_vector) s.pop_back();
    if (a_vector) s.erase(s.end() - (b_vector ? 1 : 2));
    return reshape(y, signed_shape(s));
  }
  return dispatch(a.dtype(), [&](auto t) { return matmul_nd<decltype(t)>(a, b); });
}

namespace {

// Σ over the first axis of parts, in order, as an array of `shape`.
template <class T>
Array<T> sum_slabs(const Array<T>& parts, const Shape& shape) {
  Array<T> total = xt::zeros<T>(shape);
  detail::add_column_sums(parts.data(), parts.shape()[0], total.size(), total.data());
  return total;
}

// Small layers run as products of 64-row blocks through SmallGemm (libxsmm's kernels beat
// OpenBLAS on them by 1.3-2×), 256-row slabs of blocks across the pool's threads, with the bias
// added to each block while it is in cache. The weight's gradient sums per-slab partial products
// in slab order, so its bits do not depend on the number of threads.
constexpr std::size_t block_rows = 64, slab_rows = 256;

// Runs f(slab, first row, rows) for every block of [0, N), slab by slab across the pool.
template <class F>
void for_each_block(std::size_t N, F&& f) {
  detail::parallel_ranges(N, slab_rows, [&](std::size_t first, std::size_t end) {
    for (std::size_t lo = first; lo < end; lo += block_rows) f(first / slab_rows, lo, std::min(block_rows, end - lo));
  });
}

// The kernels for a product over blocks of rows: `full` for whole blocks, `last` for the
// shorter one at the end (the same when N divides evenly).
template <class T>
struct BlockProducts {
  detail::SmallGemm<T> full, last;
  const detail::SmallGemm<T>& operator()(std::size_t rows) const { return rows == block_rows ? full : last; }
};

template <class T>
Tensor linear_rows(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const Shape sx = x.shape();
  const std::size_t in = sx.back(), out = weight.shape()[0], N = numel(sx) / std::max<std::size_t>(in, 1);
  const std::size_t tail = N % block_rows == 0 ? block_rows : N % block_rows;
  Shape sy = sx;
  sy.back() = out;
  // y (N, out) = x (N, in) · Wᵀ, then + b on every row.
  Array<T> y = Array<T>::from_shape(sy);
  const T* X = x.value<T>().data();
  const T* b = bias.defined() ? bias.value<T>().data() : nullptr;
  const auto add_bias = [&](std::size_t lo, std::size_t rows) {
    if (b) detail::add_rows(y.data() + lo * out, rows, out, b, y.data() + lo * out);
  };
  const BlockProducts<T> forward{{false, block_rows, out, in, in, out, out, false}, {false, tail, out, in, in, out, out, false}};
  const bool blocked = N > 0 && forward.full.generated() && forward.last.generated();
  if (blocked) {
    Array<T> wt = Array<T>::from_shape({in, out});  // Wᵀ, as the blocks' right operand
    detail::transpose(weight.value<T>().data(), out, in, in, wt.data());
    for_each_block(N, [&](std::size_t, std::size_t lo, std::size_t rows) {
      forward(rows)(X + lo * in, wt.data(), y.data() + lo * out);
      add_bias(lo, rows);
    });
  } else {
    gemm(false, true, N, out, in, X, weight.value<T>().data(), T(0), y.data());
    add_bias(0, N);
  }
  return record_op<T>("linear", std::move(y), {&x, &weight, &bias}, [x, weight, N, in, out, tail, blocked](BackwardContext<T>& ctx) {
    // forward was y = x Wᵀ + b, so dx = dy W, dW = dyᵀ x, db = Σ_rows dy.
    const T* g = ctx.grad().data();
    const T* X = x.value<T>().data();
    const T* W = weight.value<T>().data();
    if (!blocked) {
      if (ctx.needs(0)) {
        Array<T> dx = Array<T>::from_shape(x.shape());
        gemm(false, false, N, in, out, g, W, T(0), dx.data());
        ctx.accumulate(0, std::move(dx));
      }
      if (ctx.needs(1)) {
        Array<T> dw = Array<T>::from_shape(weight.shape());
        gemm(true, false, out, in, N, g, X, T(0), dw.data());
        ctx.accumulate(1, std::move(dw));
      }
      if (ctx.needs(2)) {
        Array<T> db = xt::zeros<T>(Shape{out});
        detail::add_column_sums(g, N, out, db.data());
        ctx.accumulate(2, std::move(db));
      }
      return;
    }
    const std::size_t slabs = (N + slab_rows - 1) / slab_rows;
    const bool want_dx = ctx.needs(0), want_dw = ctx.needs(1), want_db = ctx.needs(2);
    Array<T> dx, dw_parts, db_parts;
    if (want_dx) dx = Array<T>::from_shape(x.shape());
    if (want_dw) dw_parts = Array<T>::from_shape({slabs, out, in});
    if (want_db) db_parts = xt::zeros<T>(Shape{slabs, out});
    const BlockProducts<T> dx_of{{false, block_rows, in, out, out, in, in, false}, {false, tail, in, out, out, in, in, false}};
    const BlockProducts<T> dw_set{{true, out, in, block_rows, out, in, in, false}, {true, out, in, tail, out, in, in, false}};
    const BlockProducts<T> dw_add{{true, out, in, block_rows, out, in, in, true}, {true, out, in, tail, out, in, in, true}};
    for_each_block(N, [&](std::size_t s, std::size_t lo, std::size_t rows) {
      const T* gb = g + lo * out;
      if (want_dx) dx_of(rows)(gb, W, dx.data() + lo * in);
      if (want_dw) (lo == s * slab_rows ? dw_set : dw_add)(rows)(gb, X + lo * in, dw_parts.data() + s * out * in);
      if (want_db) detail::add_column_sums(gb, rows, out, db_parts.data() + s * out);
    });
    if (want_dx) ctx.accumulate(0, std::move(dx));
    if (want_dw) ctx.accumulate(1, sum_slabs(dw_parts, Shape{out, in}));
    if (want_db) ctx.accumulate(2, sum_slabs(db_parts, Shape{out}));
  });
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  std::vector<const Tensor*> given{&x, &weight};
  if (bias.defined()) given.push_back(&bias);
  check_inputs("linear", given);
  const Shape sx = x.shape(), sw = weight.shape();
  if (sw.size() != 2) fail("linear", "weight must be (out, in), got {}", to_string(sw));
  if (sx.empty() || sx.back() != sw[1])
    fail("linear", "input {} does not end in the weight's in-features {} (weight {})", to_string(sx), sw[1], to_string(sw));
  if (bias.defined() && bias.shape() != Shape{sw[0]})
    fail("linear", "bias has shape {} but the weight {} needs ({})", to_string(bias.shape()), to_string(sw), sw[0]);
  return dispatch(x.dtype(), [&](auto t) { return linear_rows<decltype(t)>(x, weight, bias); });
}

}  // namespace qkv
