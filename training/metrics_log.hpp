#pragma once
// A run's metrics.jsonl (and snapshots.jsonl): lines appended as the run goes, and cut back to a
// checkpoint's step when it resumes.
#include <fstream>
#include <memory>
#include <string>

namespace qkv::training {

// Appends one JSON object a line to a run's metrics.jsonl, flushed at once; a failed write throws
// std::runtime_error naming the file (a full disk fails the run, rather than losing its log).
class MetricsLog {
 public:
  // Opens `path` to append; with `truncate`, empties it first.
  MetricsLog(std::string path, bool truncate);
  void write(const std::string& line);

 private:
  std::string path_;
  std::unique_ptr<std::ofstream> out_;
};

// Cuts a metrics.jsonl (or snapshots.jsonl, whose lines nest `max_depth` deep) back to the lines
// of steps up to `step` (a resumed run writes the rest again), dropping a line cut short by a
// kill. Throws std::runtime_error naming the file.
void truncate_metrics(const std::string& path, std::size_t step, int max_depth = 1);
}  // namespace qkv::training
