#include "qkv/core/shape.hpp"

#include <algorithm>
#include <charconv>

#include <fmt/ranges.h>

namespace qkv {

std::string to_string(const Shape& shape) { return fmt::format("({})", fmt::join(shape, ",")); }

std::optional<std::size_t> parse_count(std::string_view text) {
  std::size_t value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (text.empty() || error != std::errc() || stop != end) return std::nullopt;
  return value;
}

std::size_t numel(const Shape& shape) {
  std::size_t n = 1;
  for (std::size_t d : shape) n *= d;
  return n;
}

namespace {

// Dimension i of `s` aligned from the right in `ndim` dimensions, as numpy does: 1 before its start.
std::size_t aligned(const Shape& s, std::size_t ndim, std::size_t i) { return i < ndim - s.size() ? 1 : s[i - (ndim - s.size())]; }

}  // namespace

std::optional<Shape> try_broadcast_shapes(const Shape& a, const Shape& b) {
  const std::size_t ndim = std::max(a.size(), b.size());
  Shape out(ndim);
  for (std::size_t i = 0; i < ndim; ++i) {
    const std::size_t da = aligned(a, ndim, i), db = aligned(b, ndim, i);
    if (da != db && da != 1 && db != 1) return std::nullopt;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Shape broadcast_shapes(std::string_view op, const Shape& a, const Shape& b) {
  if (auto out = try_broadcast_shapes(a, b)) return *out;
  const std::size_t ndim = std::max(a.size(), b.size());
  std::size_t i = 0;  // the first dimension at fault
  while (aligned(a, ndim, i) == aligned(b, ndim, i) || aligned(a, ndim, i) == 1 || aligned(b, ndim, i) == 1) ++i;
  fail(op, "shapes {} and {} cannot broadcast (dimension {} is {} and {})", to_string(a), to_string(b), i,
       aligned(a, ndim, i), aligned(b, ndim, i));
}

std::size_t normalize_axis(std::string_view op, std::int64_t axis, std::size_t ndim) {
  const auto n = static_cast<std::int64_t>(ndim);
  if (axis < -n || axis >= n)
    fail(op, "axis {} out of range for a tensor with {} dimensions", axis, ndim);
  return static_cast<std::size_t>(axis < 0 ? axis + n : axis);
}

std::vector<std::size_t> normalize_axes(std::string_view op, const std::vector<std::int64_t>& axes,
                                        std::size_t ndim) {
  std::vector<std::size_t> out;
  if (axes.empty()) {
    for (std::size_t i = 0; i < ndim; ++i) out.push_back(i);
    return out;
  }
  for (std::int64_t a : axes) out.push_back(normalize_axis(op, a, ndim));
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end())
    fail(op, "axis listed twice in ({})", fmt::join(axes, ","));
  return out;
}

}  // namespace qkv
