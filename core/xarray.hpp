#pragma once
// xtensor's xarray, usable under C++20. Include this rather than <xtensor/xarray.hpp>.
//
// xtensor 0.24 picks the temporary type of an expression from its shape type. Its guard against
// GCC's P0522 template-template matching is written for C++17 only, so under C++20 xarray's
// shape svector<size_t, 4, A, Init> matches `S<X, N>` and its temporaries become rank-4 xtensors:
// strided-view assignment and immediate reductions then read garbage shapes. This explicit
// specialization restores xarray, as the library intends.
#include <cstddef>
#include <memory>

#include <xtensor/xexpression_traits.hpp>

namespace xt::detail {
template <>
struct xtype_for_shape<xt::svector<std::size_t, 4, std::allocator<std::size_t>, true>> {
  template <class T, layout_type L>
  using type = xarray<T, L>;
};
}  // namespace xt::detail

#include <xtensor/xarray.hpp>
