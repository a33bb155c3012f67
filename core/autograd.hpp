#pragma once
// Controls over the tape: gradient mode, anomaly detection, and its size (for tests and tools).
#include <cstddef>

namespace qkv {

// While alive, ops record nothing on this thread's tape and their outputs need no gradient.
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

bool is_grad_enabled();

// Anomaly mode: the first op whose forward or backward produces NaN, or produces Inf from finite
// inputs, throws std::runtime_error naming itself. Off by default (it scans every result).
void set_detect_anomaly(bool enabled);
bool is_anomaly_enabled();

class DetectAnomalyGuard {
 public:
  DetectAnomalyGuard();
  ~DetectAnomalyGuard();
  DetectAnomalyGuard(const DetectAnomalyGuard&) = delete;
  DetectAnomalyGuard& operator=(const DetectAnomalyGuard&) = delete;

 private:
  bool previous_;
};

// Records on this thread's tape that can still receive a gradient.
std::size_t tape_size();

}  // namespace qkv
