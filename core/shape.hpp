#pragma once
// Shapes, axes and broadcasting: the checks every op shares, with errors that name the op.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace qkv {

using Shape = std::vector<std::size_t>;

// A size or count written in decimal digits alone ("1000"); none for anything else: a sign,
// spaces, other characters, or a number past 2^64 − 1 (std::stoull would take "-1" as 2^64 − 1).
std::optional<std::size_t> parse_count(std::string_view text);

// "(2,3)"; "()" for a scalar.
std::string to_string(const Shape& shape);

template <class S>
Shape to_shape(const S& s) { return Shape(s.begin(), s.end()); }

std::size_t numel(const Shape& shape);

// The numpy broadcast of two shapes (the one rule every op follows); none, or a throw naming `op`,
// when they do not broadcast.
std::optional<Shape> try_broadcast_shapes(const Shape& a, const Shape& b);
Shape broadcast_shapes(std::string_view op, const Shape& a, const Shape& b);

// Maps a Python-style axis (negative counts from the end) into [0, ndim); throws naming `op`.
std::size_t normalize_axis(std::string_view op, std::int64_t axis, std::size_t ndim);

// Normalized, sorted, unique axes. Empty `axes` means every axis.
std::vector<std::size_t> normalize_axes(std::string_view op, const std::vector<std::int64_t>& axes,
                                        std::size_t ndim);

// Throws std::invalid_argument with the message "op: <formatted text>".
template <class... Args>
[[noreturn]] void fail(std::string_view op, fmt::format_string<Args...> text, Args&&... args) {
  throw std::invalid_argument(fmt::format("{}: {}", op, fmt::format(text, std::forward<Args>(args)...)));
}

}  // namespace qkv
