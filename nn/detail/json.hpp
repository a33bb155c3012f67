#pragma once
// JSON from a file, with its nesting bounded: nlohmann::json prints, compares, copies and frees
// values recursively, so a file nested 100,000 deep would overflow the stack in any of them.
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace qkv::nn::detail {

// Parses `text`, nested at most `max_depth` arrays or objects deep (a flat object is depth 1);
// anything else throws std::runtime_error naming `file` and the fault.
nlohmann::json parse_json(std::string_view text, const std::string& file, int max_depth);

}  // namespace qkv::nn::detail
