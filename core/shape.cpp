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

Shape broadcast_shapes(std::string_view op, const Shape& a, const Shape& b) {
  const std::size_t ndim = std::max(a.size(), b.size());
  Shape out(ndim);
  for (std::size_t i = 0; i < ndim; ++i) {
    // Align from the right, as numpy does.
    const std::size_t da = i < ndim - a.size() ? 1 : a[i - (ndim - a.size())];
    const std::size_t db = i < ndim - b.size() ? 1 : b[i - (ndim - b.size())];
    if (da != db && da != 1 && db != 1)
      fail(op, "shapes {} and {} cannot broadcast (dimension {} is {} and {})", to_string(a),
           to_string(b), i, da, db);
    out[i] = da == 1 ? db : da;
  }
  return out;
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
