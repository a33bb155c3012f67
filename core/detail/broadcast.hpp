#pragma once
// Broadcasting by runs: the elements of an output and of an input broadcast to its shape, walked
// as runs of consecutive elements of both, so that a loop (which the compiler vectorises) does
// what xtensor's generic broadcasting assigner does element by element.
#include <cstddef>
#include <stdexcept>
#include <vector>

#include "qkv/core/shape.hpp"

namespace qkv::detail {

// Calls run(out_offset, in_offset, n) for every run of n consecutive elements of an array of shape
// `out` whose values pair with n consecutive elements of an array of shape `in` broadcast to
// `out` (dimensions aligned on the right, size 1 repeated), row-major, in order. `in` must
// broadcast to `out`; a single value pairs with every element (in_offset 0, runs of one).
template <class Run>
void for_each_run(const Shape& out, const Shape& in, Run&& run) {
  if (in.size() > out.size()) throw std::logic_error("for_each_run: the input has more dimensions than the output");
  const std::size_t nd = out.size(), lead = nd - in.size();
  std::size_t total = 1;
  for (const std::size_t d : out) total *= d;
  if (total == 0) return;
  // The trailing dimensions the two share make one run.
  std::size_t split = nd, length = 1;
  while (split > lead && in[split - 1 - lead] == out[split - 1]) length *= out[--split];
  if (split == 0) return run(std::size_t(0), std::size_t(0), total);
  // Strides of `in` over the dimensions before the run (0 where it repeats).
  std::vector<std::size_t> stride(split, 0), index(split, 0);
  std::size_t s = 1;
  for (std::size_t d = nd; d-- > lead;) {
    if (d < split) stride[d] = in[d - lead] == 1 ? 0 : s;
    s *= in[d - lead];
  }
  std::size_t in_offset = 0;
  for (std::size_t o = 0; o < total; o += length) {
    run(o, in_offset, length);
    for (std::size_t d = split; d-- > 0;) {  // the next index, and the input's offset with it
      in_offset += stride[d];
      if (++index[d] < out[d]) break;
      in_offset -= stride[d] * index[d];
      index[d] = 0;
    }
  }
}

}  // namespace qkv::detail
