#pragma once
// Reading and writing a run folder's files safely: regular files only, bounded sizes, and writes
// that a reader sees whole or not at all.
#include <cstddef>
#include <string>
#include <string_view>

namespace qkv::nn {

// The bytes of the regular file at `path` (symbolic links followed). Anything else throws
// std::runtime_error naming the file: a FIFO, a device or a folder (never waiting on one), a file
// that cannot be opened or read, or one larger than `max_bytes`.
std::string read_file(const std::string& path, std::size_t max_bytes);

// Replaces `path` by `bytes` so that a reader sees the old file or the new one, never a part:
// writes `path`.tmp, flushes it to disk, renames it over `path`, and flushes the folder. A stale
// `path`.tmp from a save that died is simply overwritten; a write or rename that fails (a full
// disk, a folder at `path`) removes `path`.tmp before it throws.
void write_atomically(const std::string& path, std::string_view bytes);

// Writes `bytes` to a new file `path` and flushes it to disk (no rename: for files inside a folder
// that is itself committed by a rename).
void write_durably(const std::string& path, std::string_view bytes);

// Flushes a folder's entries (new, renamed and removed names) to disk.
void sync_folder(const std::string& dir);

// The memory this machine has available now (MemAvailable), in bytes; its physical memory where
// that is not known.
double available_memory();

}  // namespace qkv::nn
