#pragma once
// The interactive part of `qkv inspect --html`'s page: pick a layer and head, hover a token (or a
// cell of the picture) to see where it attends and which queries attend it, and move a slider over
// the steps along training (the checkpoints the run kept, or its snapshots of this input), which
// redraws the attention, the two token strips and the head's σ at that step. Its data are in the
// page, with no request beyond it.
#include <cstddef>
#include <string>
#include <vector>

#include "qkv/analysis/inspect.hpp"

namespace qkv::report {

// The most bytes of attention the section packs into the page: past it, it keeps fewer steps,
// evenly spaced, the first and the last among them (the last alone when one step is more).
inline constexpr std::size_t max_explore_bytes = 1'000'000;
// The bytes one step takes, and which of `steps` steps (their indices, in order) the page keeps.
std::size_t explore_bytes_per_step(std::size_t layers, std::size_t heads, std::size_t length);
std::vector<std::size_t> explore_steps(std::size_t steps, std::size_t bytes_per_step);

// The section (heading, controls, strips, picture) and its data (a JSON script); the attention of
// the model as inspected alone when `in.along_training` is empty.
std::string explore_html(const analysis::Inspection& in);
// Its script (JavaScript, no <script> tag), for the page's one script, after the section.
std::string explore_script();

}  // namespace qkv::report
