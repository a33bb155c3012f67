// scaled_dot_product_attention: every head of a batch at once, heads packed in the last dimension,
// in tiles as FlashAttention computes it (Dao et al. 2022; the work split of Dao 2023). Per batch
// entry b and head h, with Q, K, V the head's (rows × d) slices read in place, a block of queries
// meets the blocks of keys one after another:
//   Sᵀ = K_j Q_iᵀ, then an online softmax down each query's column (its running maximum m and
//   total l; what came before is rescaled by e^(m_old − m)), O_i += P V_j; at the end O_i /= l,
//   and m and 1/l are all that is kept for backward besides O.
// Backward, from dO: D = rowsum(dO ⊙ O); per block of keys, per block of queries that see it,
//   Pᵀ = e^(scale · Sᵀ − m) / l again, dV_j += Pᵀ dO_i, dPᵀ = V_j dO_iᵀ,
//   dSᵀ = scale · Pᵀ ⊙ (dPᵀ − D), dQ_i += dS K_j, dK_j += dSᵀ Q_i.
// Memory is linear in the length: no Tq × Tk matrix exists beyond one tile (an arbitrary mask,
// which is one, is the caller's, and backward keeps a copy). Under a causal mask
// the tiles above the diagonal are skipped. Scores are transposed (one row per key, one column per
// query) so that the softmax runs 16 queries side by side (core/kernels.cpp); the products of a
// tile are kernels libxsmm generated for its sizes (detail::SmallGemm), and Qᵀ and dOᵀ are copied
// per head so that every product is of the kinds it generates. Work is split across threads by
// (b, kv head); the G = H / Hkv query heads that share a kv head run in order on one thread, since
// their dK and dV add up. A single query outside autograd (decoding) has its scores as one row.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "qkv/core/detail/attention.hpp"
#include "qkv/core/detail/blas.hpp"
#include "qkv/core/detail/kernels.hpp"
#include "qkv/core/detail/op.hpp"
#include "qkv/core/ops.hpp"
#include "qkv/core/runtime.hpp"

namespace qkv {

namespace {

constexpr const char* op_name = "scaled_dot_product_attention";

struct Layout {
  std::size_t B, Tq, Tk, H, Hkv, dh, dv;
  bool causal;
  const bool* allowed;  // (B, H, Tq, Tk) or null
  std::size_t G() const { return H / Hkv; }  // query heads per kv head
  // Keys [0, limit) may be seen by query i, before the `allowed` mask: under the causal mask
  // 0 … Tk − Tq + i, none when Tq > Tk + i.
  std::size_t limit(std::size_t i) const { return !causal ? Tk : Tk + i + 1 > Tq ? std::min(Tk, Tk + i + 1 - Tq) : 0; }
  const bool* allowed_row(std::size_t b, std::size_t h, std::size_t i) const {
    return allowed ? allowed + ((b * H + h) * Tq + i) * Tk : nullptr;
  }
};

// Scores are kept transposed, Sᵀ with one row per key and one column per query, in tiles of
// block × block: 16 KB of float32 scores, in L1 with the tile's queries, keys and values in L2.
// Square tiles put the causal diagonal on tiles' diagonals when Tq = Tk.
constexpr std::size_t block = 64;

std::size_t padded(std::size_t n) { return (n + detail::softmax_lanes - 1) / detail::softmax_lanes * detail::softmax_lanes; }

// Whether backward keeps the weights rather than computing them again: when there are no more keys
// than one tile holds, so that they take at most `block` numbers per query, as O takes d_v. All the
// queries of a head then form one tile.
bool keeps_weights(const Layout& L) { return L.Tk <= block; }

// Per-thread scratch, reused across calls.
template <class T>
T* scratch(std::size_t n) {
  thread_local std::vector<T> buffer;
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

// Runs f(b, kv) for every batch entry and kv head, in contiguous runs across the pool's threads:
// the heads of one batch entry write neighbouring columns of the same rows, and interleaving them
// between threads would make the threads share cache lines.
template <class F>
void for_each_head(const Layout& L, F&& f) {
  const std::size_t n = L.B * L.Hkv, runs = std::min(n, 16 * get_num_threads());
  detail::parallel_ranges(n, (n + runs - 1) / std::max<std::size_t>(runs, 1), [&](std::size_t lo, std::size_t hi) {
    for (std::size_t t = lo; t < hi; ++t) f(t / L.Hkv, t % L.Hkv);
  });
}

// Where q, k or v sits: input `tensor` of the op, rows of `ld` elements, the first head at `col`,
// batch entries `rows` rows apart (0: as many as the sequence has, Tq or Tk).
struct Operand {
  std::size_t tensor, ld, col, rows = 0;
};

// The heads of q, k and v, in place: where each head starts and the step between batch entries.
// Gradients are laid out as their inputs.
template <class T>
struct Heads {
  const T *Q, *K, *V;
  std::size_t bq, bk, bv;  // elements between batch entries
  Heads(const std::vector<Tensor>& in, const Operand (&op)[3], const Layout& L)
      : Q(in[op[0].tensor].value<T>().data() + op[0].col),
        K(in[op[1].tensor].value<T>().data() + op[1].col),
        V(in[op[2].tensor].value<T>().data() + op[2].col),
        bq((op[0].rows ? op[0].rows : L.Tq) * op[0].ld),
        bk((op[1].rows ? op[1].rows : L.Tk) * op[1].ld),
        bv((op[2].rows ? op[2].rows : L.Tk) * op[2].ld) {}
  std::size_t q(std::size_t b, std::size_t h, const Layout& L) const { return b * bq + h * L.dh; }
  std::size_t k(std::size_t b, std::size_t kv, const Layout& L) const { return b * bk + kv * L.dh; }
  std::size_t v(std::size_t b, std::size_t kv, const Layout& L) const { return b * bv + kv * L.dv; }
};

// The products of one tile shape, nk keys × nq queries; Sᵀ and dPᵀ have rows of ld. Of each pair,
// the first sets its block of the result and the second writes a part (rows of d numbers, dense)
// that detail::add_block then adds: a sum over many tiles adds each tile's total once, rather than chaining
// every multiply-add of every tile onto one accumulator (which gave dK twice PyTorch's float32
// error at 600 positions).
template <class T>
struct TileProducts {
  using Product = detail::SmallGemm<T>;
  Product scores, mix_set, mix_part, dv_set, dv_part, dp, dq_set, dq_part, dk_set, dk_part;
  TileProducts(const Layout& L, const Operand (&op)[3], std::size_t nk, std::size_t nq, std::size_t ld)
      : scores(false, nk, nq, L.dh, op[1].ld, L.Tq, ld, false),  // Sᵀ = K_j · (Qᵀ)_i
        mix_set(true, nq, L.dv, nk, ld, op[2].ld, L.H * L.dv, false),  // O_i = (Pᵀ)ᵀ V_j
        mix_part(true, nq, L.dv, nk, ld, op[2].ld, L.dv, false),
        dv_set(false, nk, L.dv, nq, ld, L.H * L.dv, op[2].ld, false),  // dV_j = Pᵀ dO_i
        dv_part(false, nk, L.dv, nq, ld, L.H * L.dv, L.dv, false),
        dp(false, nk, nq, L.dv, op[2].ld, L.Tq, ld, false),  // dPᵀ = V_j · (dOᵀ)_i
        dq_set(true, nq, L.dh, nk, ld, op[1].ld, op[0].ld, false),  // dQ_i = (dSᵀ)ᵀ K_j
        dq_part(true, nq, L.dh, nk, ld, op[1].ld, L.dh, false),
        dk_set(false, nk, L.dh, nq, ld, op[0].ld, op[1].ld, false),  // dK_j = dSᵀ Q_i
        dk_part(false, nk, L.dh, nq, ld, op[0].ld, L.dh, false) {}
};

// Sets `out` with `set` when first, else adds the product `part` writes (into scratch `buffer`).
template <class T>
void set_or_add(bool first, const detail::SmallGemm<T>& set, const detail::SmallGemm<T>& part, std::size_t rows,
                std::size_t cols, T* buffer, const T* a, const T* b, T* out, std::size_t ld) {
  if (first) return set(a, b, out);
  part(a, b, buffer);
  detail::add_block(buffer, rows, cols, out, ld, nullptr);
}

// The tiles of one call: full ones of bk × bq, and those cut short at the ends of the sequences.
template <class T>
class Tiles {
 public:
  Tiles(const Layout& L, const Operand (&op)[3])
      : bq(keeps_weights(L) ? std::max<std::size_t>(L.Tq, 1) : block), bk(std::min(block, std::max<std::size_t>(L.Tk, 1))),
        ld(padded(bq)) {
    for (const std::size_t nk : {bk, L.Tk % bk ? L.Tk % bk : bk})
      for (const std::size_t nq : {bq, L.Tq % bq ? L.Tq % bq : bq}) shapes_.emplace_back(L, op, nk, nq, ld);
  }
  const TileProducts<T>& operator()(std::size_t nk, std::size_t nq) const {
    return shapes_[(nk != bk ? 2 : 0) + (nq != bq ? 1 : 0)];
  }
  const std::size_t bq, bk, ld;

 private:
  std::vector<TileProducts<T>> shapes_;
};

// What forward leaves for backward besides O: the weights Pᵀ, one (Tk × ld) tile per head, when
// it keeps them; otherwise each query's maximum scaled score (0 when it sees nothing) and the
// inverse of its total, (B, H, Tq) each.
template <class T>
struct Saved {
  Array<T> weights, shift, inverse;  // Arrays, since a vector would spend time zeroing them
};

// How many of the keys [j0, j0 + nk) query i may see, before the `allowed` mask: a prefix.
std::size_t visible(const Layout& L, std::size_t i, std::size_t j0, std::size_t nk) {
  const std::size_t end = L.limit(i);
  return end > j0 ? std::min(end - j0, nk) : 0;
}

// Runs f(c0, limits) for each block of 16 columns of the tile of keys [j0, j0 + nk) against
// queries [i0, i0 + nq), limits being each column's visible keys within the tile (0 past the
// queries): what the softmax kernels take.
template <class F>
void by_columns(const Layout& L, std::size_t i0, std::size_t nq, std::size_t j0, std::size_t nk, F&& f) {
  std::int32_t limits[detail::softmax_lanes];
  for (std::size_t c0 = 0; c0 < nq; c0 += detail::softmax_lanes) {
    for (std::size_t c = 0; c < detail::softmax_lanes; ++c)
      limits[c] = std::int32_t(c0 + c < nq ? visible(L, i0 + c0 + c, j0, nk) : 0);
    f(c0, limits);
  }
}

// With an arbitrary mask, a tile's hidden scores become −inf, the others scaled (scaled before, so
// that no scale multiplies an infinity); the softmax then runs with scale 1 (softmax_scale).
template <class T>
void mask_tile(T* S, std::size_t ld, const Layout& L, std::size_t b, std::size_t h, std::size_t i0, std::size_t nq,
               std::size_t j0, std::size_t nk, T scale) {
  for (std::size_t c = 0; c < nq; ++c) {
    const bool* ok = L.allowed_row(b, h, i0 + c) + j0;
    const std::size_t n = visible(L, i0 + c, j0, nk);
    for (std::size_t j = 0; j < n; ++j) S[j * ld + c] = ok[j] ? S[j * ld + c] * scale : -std::numeric_limits<T>::infinity();
  }
}

// The scale the softmax kernels apply: 1 when mask_tile scaled the scores already.
template <class T>
T softmax_scale(const Layout& L, T scale) {
  return L.allowed ? T(1) : scale;
}

// The first query that sees key j0.
std::size_t first_query(const Layout& L, std::size_t j0) { return L.causal && j0 + L.Tq > L.Tk ? j0 + L.Tq - L.Tk : 0; }

// One query outside autograd (decoding): its scores are one row, against every key at once.
template <class T>
void single_query(const Heads<T>& x, const Operand (&op)[3], const Layout& L, T scale, T* O) {
  using Product = detail::SmallGemm<T>;
  const Product scores(false, L.Tk, 1, L.dh, op[1].ld, 1, 1, false);     // s = K q
  const Product mix(true, 1, L.dv, L.Tk, 1, op[2].ld, L.H * L.dv, false);  // o = sᵀ V
  for_each_head(L, [&](std::size_t b, std::size_t kv) {
    T* s = scratch<T>(L.Tk);
    for (std::size_t h = kv * L.G(); h < (kv + 1) * L.G(); ++h) {
      scores(x.K + x.k(b, kv, L), x.Q + x.q(b, h, L), s);
      if (L.allowed) mask_tile(s, 1, L, b, h, 0, 1, 0, L.Tk, scale);
      detail::softmax_row(s, L.Tk, L.limit(0), softmax_scale(L, scale));
      mix(s, x.V + x.v(b, kv, L), O + b * L.H * L.dv + h * L.dv);
    }
  });
}

// Forward into O (B, Tq, H·dv), saving what backward needs when `saved` is not null.
template <class T>
void forward(const Heads<T>& x, const Operand (&op)[3], const Layout& L, T scale, T* O, Saved<T>* saved) {
  const Tiles<T> tiles(L, op);
  const std::size_t ldo = L.H * L.dv, ld = tiles.ld;
  const bool keep = keeps_weights(L);
  const T shown = softmax_scale(L, scale), minus_inf = -std::numeric_limits<T>::infinity();
  if (L.Tq == 0 || L.Tk == 0) {  // no tile: queries that see no key get zeros
    std::fill(O, O + L.B * L.Tq * ldo, T(0));
    return;
  }
  if (saved && keep) saved->weights = Array<T>::from_shape({L.B, L.H, L.Tk, ld});
  // One flat run of B·H·Tq each, indexed through data(): xtensor gives a dimension of size 1 the
  // stride 0, and a flat index through operator[] would land on the first element.
  if (saved && !keep) saved->shift = saved->inverse = Array<T>::from_shape({L.B * L.H * L.Tq});
  for_each_head(L, [&](std::size_t b, std::size_t kv) {
    T* Qt = scratch<T>(L.dh * L.Tq + tiles.bk * ld + 3 * ld + block * L.dv);
    T *tile = Qt + L.dh * L.Tq, *m = tile + tiles.bk * ld, *l = m + ld, *rescale = l + ld, *part = rescale + ld;
    const T *K = x.K + x.k(b, kv, L), *V = x.V + x.v(b, kv, L);
    for (std::size_t h = kv * L.G(); h < (kv + 1) * L.G(); ++h) {
      detail::transpose(x.Q + x.q(b, h, L), L.Tq, L.dh, op[0].ld, Qt);
      T* Oh = O + b * L.Tq * ldo + h * L.dv;
      if (keep) {  // one tile: the plain softmax, and the weights kept
        T* S = saved ? saved->weights.data() + (b * L.H + h) * L.Tk * ld : tile;
        const TileProducts<T>& p = tiles(L.Tk, L.Tq);
        p.scores(K, Qt, S);
        if (L.allowed) mask_tile(S, ld, L, b, h, 0, L.Tq, 0, L.Tk, scale);
        by_columns(L, 0, L.Tq, 0, L.Tk, [&](std::size_t c0, const std::int32_t* limits) {
          detail::softmax_columns(S + c0, ld, L.Tk, limits, shown);
        });
        p.mix_set(S, V, Oh);
        continue;
      }
      for (std::size_t i0 = 0; i0 < L.Tq; i0 += tiles.bq) {
        const std::size_t nq = std::min(tiles.bq, L.Tq - i0), end = L.limit(i0 + nq - 1);
        T* Oi = Oh + i0 * ldo;
        std::fill(m, m + ld, minus_inf);
        std::fill(l, l + ld, T(0));
        if (end == 0)  // no query of the block sees a key (causal, Tq > Tk): no product sets O_i
          for (std::size_t c = 0; c < nq; ++c) std::fill(Oi + c * ldo, Oi + c * ldo + L.dv, T(0));
        for (std::size_t j0 = 0; j0 < end; j0 += tiles.bk) {
          const std::size_t nk = std::min(tiles.bk, L.Tk - j0);
          const TileProducts<T>& p = tiles(nk, nq);
          p.scores(K + j0 * op[1].ld, Qt + i0, tile);
          if (L.allowed) mask_tile(tile, ld, L, b, h, i0, nq, j0, nk, scale);
          by_columns(L, i0, nq, j0, nk, [&](std::size_t c0, const std::int32_t* limits) {
            detail::online_softmax_columns(tile + c0, ld, nk, limits, shown, m + c0, l + c0, rescale + c0);
          });
          if (j0 == 0) {
            p.mix_set(tile, V, Oi);
          } else {  // O_i · e^(m_old − m) + P V_j
            p.mix_part(tile, V + j0 * op[2].ld, part);
            detail::add_block(part, nq, L.dv, Oi, ldo, rescale);
          }
        }
        for (std::size_t c = 0; c < nq; ++c) {
          const T inverse = l[c] > 0 ? 1 / l[c] : 0;  // a query that sees nothing: a row of 0
          for (std::size_t e = 0; e < L.dv; ++e) Oi[c * ldo + e] *= inverse;
          if (saved) {
            saved->shift.data()[(b * L.H + h) * L.Tq + i0 + c] = m[c];
            detail::to_softmax_shift(saved->shift.data()[(b * L.H + h) * L.Tq + i0 + c]);
            saved->inverse.data()[(b * L.H + h) * L.Tq + i0 + c] = inverse;
          }
        }
      }
    }
  });
}

// Backward into dQ, dK, dV (null when not needed), laid out as q, k and v. Every element is set:
// the first product into each block sets it and the others add, since q, k and v together cover
// each input (a call with no queries or no keys has no products, and the caller zeroes; queries
// that see no key under the causal mask, before the first block that meets key 0, are zeroed here).
template <class T>
void backward(const Heads<T>& x, const Operand (&op)[3], const Layout& L, T scale, const Saved<T>& saved,
              const T* O, const T* dO, T* dQ, T* dK, T* dV) {
  const Tiles<T> tiles(L, op);
  const std::size_t ldo = L.H * L.dv, ld = tiles.ld, Tq_padded = padded(L.Tq);
  const bool keep = keeps_weights(L);
  const T shown = softmax_scale(L, scale);
  for_each_head(L, [&](std::size_t b, std::size_t kv) {
    T* Qt = scratch<T>((L.dh + L.dv) * L.Tq + 2 * tiles.bk * ld + 3 * Tq_padded + block * std::max(L.dh, L.dv));
    T *dOt = Qt + L.dh * L.Tq, *tile = dOt + L.dv * L.Tq, *dS = tile + tiles.bk * ld, *D = dS + tiles.bk * ld,
      *shift = D + Tq_padded, *inverse = shift + Tq_padded, *part = inverse + Tq_padded;
    const T *K = x.K + x.k(b, kv, L), *V = x.V + x.v(b, kv, L);
    for (std::size_t h = kv * L.G(); h < (kv + 1) * L.G(); ++h) {
      const T *Q = x.Q + x.q(b, h, L), *dOh = dO + b * L.Tq * ldo + h * L.dv;
      T* dQh = dQ ? dQ + x.q(b, h, L) : nullptr;
      if (dQh)
        for (std::size_t i = 0; i < first_query(L, 0) / tiles.bq * tiles.bq; ++i)
          std::fill(dQh + i * op[0].ld, dQh + i * op[0].ld + L.dh, T(0));
      if (!keep) {
        // D = rowsum(dO ⊙ O) and the softmax's statistics, padded to whole blocks of 16 columns.
        const T* Oh = O + b * L.Tq * ldo + h * L.dv;
        const std::size_t row = (b * L.H + h) * L.Tq;
        for (std::size_t i = 0; i < Tq_padded; ++i) {
          D[i] = i < L.Tq ? detail::dot(dOh + i * ldo, Oh + i * ldo, L.dv) : 0;
          shift[i] = i < L.Tq ? saved.shift.data()[row + i] : 0;
          inverse[i] = i < L.Tq ? saved.inverse.data()[row + i] : 0;
        }
        detail::transpose(Q, L.Tq, L.dh, op[0].ld, Qt);
      }
      if (dQ || dK) detail::transpose(dOh, L.Tq, L.dv, ldo, dOt);  // for dPᵀ, which only they need
      for (std::size_t j0 = 0; j0 < L.Tk; j0 += tiles.bk) {
        const std::size_t nk = std::min(tiles.bk, L.Tk - j0), start = first_query(L, j0) / tiles.bq * tiles.bq;
        for (std::size_t i0 = start; i0 < L.Tq; i0 += tiles.bq) {
          const std::size_t nq = std::min(tiles.bq, L.Tq - i0);
          const bool first_k = h == kv * L.G() && i0 == start;  // the first product into dK_j, dV_j
          const TileProducts<T>& p = tiles(nk, nq);
          const T* P = keep ? saved.weights.data() + (b * L.H + h) * L.Tk * ld : tile;
          if (!keep) {
            p.scores(K + j0 * op[1].ld, Qt + i0, tile);
            if (L.allowed) mask_tile(tile, ld, L, b, h, i0, nq, j0, nk, scale);
            by_columns(L, i0, nq, j0, nk, [&](std::size_t c0, const std::int32_t* limits) {
              detail::softmax_again_columns(tile + c0, ld, nk, limits, shown, shift + i0 + c0, inverse + i0 + c0);
            });
          }
          if (dV) set_or_add(first_k, p.dv_set, p.dv_part, nk, L.dv, part, P, dOh + i0 * ldo, dV + x.v(b, kv, L) + j0 * op[2].ld, op[2].ld);
          if (!dQ && !dK) continue;
          p.dp(V + j0 * op[2].ld, dOt + i0, dS);
          // dSᵀ: a kept tile is every key a query sees, and sums P ⊙ dP itself; otherwise D is that sum.
          by_columns(L, i0, nq, j0, nk, [&](std::size_t c0, const std::int32_t* limits) {
            detail::softmax_backward_columns(P + c0, dS + c0, ld, nk, limits, scale, keep ? nullptr : D + i0 + c0);
          });
          if (dQh) set_or_add(j0 == 0, p.dq_set, p.dq_part, nq, L.dh, part, dS, K + j0 * op[1].ld, dQh + i0 * op[0].ld, op[0].ld);
          if (dK) set_or_add(first_k, p.dk_set, p.dk_part, nk, L.dh, part, dS, Q + i0 * op[0].ld, dK + x.k(b, kv, L) + j0 * op[1].ld, op[1].ld);
        }
      }
    }
  });
}

template <class T>
Tensor attention(const std::vector<Tensor>& in, const Operand (&op)[3], const Layout& L, T scale,
                 const MaskArray& allowed) {
  bool any_grad = false;
  for (const Tensor& t : in) any_grad = any_grad || t.requires_grad();
  const bool record = is_grad_enabled() && any_grad;
  const Heads<T> x(in, op, L);
  Array<T> out = Array<T>::from_shape({L.B, L.Tq, L.H * L.dv});
  if (!record) {
    if (L.Tq == 1 && L.Tk > 0)
      single_query(x, op, L, scale, out.data());
    else
      forward(x, op, L, scale, out.data(), static_cast<Saved<T>*>(nullptr));
    return Tensor(std::move(out));
  }
  auto saved = std::make_shared<Saved<T>>();
  forward(x, op, L, scale, out.data(), saved.get());
  // Backward in tiles computes the weights again, under the same mask: a copy, since the
  // caller's may go.
  auto mask = L.allowed && !keeps_weights(L) ? std::make_shared<const MaskArray>(allowed) : nullptr;
  std::vector<const Tensor*> inputs;
  for (const Tensor& t : in) inputs.push_back(&t);
  return record_op<T>(op_name, std::move(out), inputs, [in, op0 = op[0], op1 = op[1], op2 = op[2], L, scale, saved, mask](BackwardContext<T>& ctx) {
    const Operand op[3] = {op0, op1, op2};
    Layout Lm = L;
    Lm.allowed = mask ? mask->data() : nullptr;
    std::vector<Array<T>> grads(in.size());
    for (std::size_t i = 0; i < in.size(); ++i)
      if (ctx.needs(i)) {
        grads[i] = Array<T>::from_shape(in[i].shape());
        if (L.Tq == 0 || L.Tk == 0) grads[i].fill(T(0));
      }
    const auto target = [&](const Operand& o) { return ctx.needs(o.tensor) ? grads[o.tensor].data() + o.col : nullptr; };
    backward(Heads<T>(in, op, Lm), op, Lm, scale, *saved, ctx.output().data(), ctx.grad().data(), target(op[0]),
             target(op[1]), target(op[2]));
    for (std::size_t i = 0; i < in.size(); ++i)
      if (ctx.needs(i)) ctx.accumulate(i, std::move(grads[i]));
  }, Save::output);
}

// Checks the mask and the dtype, then runs attention.
Tensor run(const std::vector<Tensor>& in, const Operand (&op)[3], Layout L, double scale, const MaskArray& allowed) {
  if (!std::isfinite(scale)) fail(op_name, "scale must be finite, got {}", scale);
  if (allowed.dimension() > 0) {
    const Shape want{L.B, L.H, L.Tq, L.Tk};
    if (to_shape(allowed.shape()) != want)
      fail(op_name, "mask of shape {} must be (B, H, Tq, Tk) = {}", to_string(to_shape(allowed.shape())),
           to_string(want));
    L.allowed = allowed.data();
  }
  return dispatch(in[0].dtype(), [&](auto t) {
    using T = decltype(t);
    return attention<T>(in, op, L, T(scale), allowed);
  });
}

void check_heads(std::size_t n_heads, std::size_t n_kv_heads) {
  if (n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0)
    fail(op_name, "{} heads and {} kv heads: need n_heads a positive multiple of n_kv_heads", n_heads, n_kv_heads);
}

}  // namespace

Tensor detail::cached_attention(const Tensor& q, const Tensor& keys, const Tensor& values,
                                std::size_t length, std::size_t n_heads, std::size_t n_kv_heads, double scale, bool causal,
                                const MaskArray& allowed) {
  check_inputs(op_name, {&q, &keys, &values});
  if (is_grad_enabled() && (q.requires_grad() || keys.requires_grad() || values.requires_grad()))
    fail(op_name, "attention against a KV cache is forward only");
  check_heads(n_heads, n_kv_heads);
  const Shape sq = q.shape(), sk = keys.shape(), sv = values.shape();
  if (sq.size() != 3 || sk.size() != 3 || sv.size() != 3 || sk[0] != sq[0] || sv[0] != sq[0] || sv[1] != sk[1] ||
      length > sk[1] || sk[2] % n_kv_heads != 0 || sv[2] % n_kv_heads != 0 || sq[2] != n_heads * (sk[2] / n_kv_heads))
    fail(op_name, "queries {} against {} cached keys of {} and values of {}: they do not fit", to_string(sq), length,
         to_string(sk), to_string(sv));
  const Layout L{sq[0], sq[1], length, n_heads, n_kv_heads, sk[2] / n_kv_heads, sv[2] / n_kv_heads, causal, nullptr};
  const Operand op[3] = {{0, sq[2], 0, 0}, {1, sk[2], 0, sk[1]}, {2, sv[2], 0, sv[1]}};
  return run({q, keys, values}, op, L, scale, allowed);
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, std::size_t n_heads,
                                    std::size_t n_kv_heads, double scale, bool causal, const MaskArray& allowed) {
  check_inputs(op_name, {&q, &k, &v});
  const Shape sq = q.shape(), sk = k.shape(), sv = v.shape();
  const auto shapes = [&] { return fmt::format("q {}, k {}, v {}", to_string(sq), to_string(sk), to_string(sv)); };
  if (sq.size() != 3 || sk.size() != 3 || sv.size() != 3)
    fail(op_name, "{}: each must be (B, T, heads·d)", shapes());
  check_heads(n_heads, n_kv_heads);
  if (sq[2] % n_heads != 0 || sk[2] % n_kv_heads != 0 || sv[2] % n_kv_heads != 0)
    fail(op_name, "{}: the last dimensions must split into {} query heads and {} kv heads", shapes(), n_heads, n_kv_heads);
  const Layout L{sq[0], sq[1], sk[1], n_heads, n_kv_heads, sq[2] / n_heads, sv[2] / n_kv_heads,
                 causal, nullptr};
  if (sk[2] / n_kv_heads != L.dh)
    fail(op_name, "{}: queries have {} features per head and keys {}", shapes(), L.dh, sk[2] / n_kv_heads);
  if (sk[0] != L.B || sv[0] != L.B || sv[1] != L.Tk)
    fail(op_name, "{}: need one batch size, and keys and values of one length", shapes());
  const Operand op[3] = {{0, sq[2], 0}, {1, sk[2], 0}, {2, sv[2], 0}};
  return run({q, k, v}, op, L, scale, allowed);
}

Tensor scaled_dot_product_attention(const Tensor& qkv, std::size_t n_heads, std::size_t n_kv_heads, std::size_t d_head,
                                    std::size_t d_v, double scale, bool causal, const MaskArray& allowed) {
  check_inputs(op_name, {&qkv});
  check_heads(n_heads, n_kv_heads);
  const Shape s = qkv.shape();
  const std::size_t width = n_heads * d_head + n_kv_heads * (d_head + d_v);
  if (s.size() != 3 || s[2] != width || d_head == 0 || d_v == 0)
    fail(op_name, "packed qkv of shape {} must be (B, T, H·d_head + Hkv·(d_head + d_v)) = (B, T, {}·{} + {}·({} + {}))",
         to_string(s), n_heads, d_head, n_kv_heads, d_head, d_v);
  const Layout L{s[0], s[1], s[1], n_heads, n_kv_heads, d_head, d_v, causal, nullptr};
  const Operand op[3] = {{0, width, 0}, {0, width, n_heads * d_head}, {0, width, (n_heads + n_kv_heads) * d_head}};
  return run({qkv}, op, L, scale, allowed);
}

}  // namespace qkv
