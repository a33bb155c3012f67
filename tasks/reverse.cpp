#include "qkv/tasks/builtin.hpp"

namespace qkv::tasks {

// The decoder must find the source's mirrored position, n − 1 − t, which needs the source's length:
// two encoder layers reach 99.8-100% exact match on seeds 0-9 (one layer: 97.9-100% on seeds 0-4).
TaskSpec reverse_task() {
  return seq2seq_spec(
      "reverse", [] { return std::make_unique<NumbersTask>(NumbersTask::Order::reversed, 10, 3, 12); }, 2, 3000);
}

}  // namespace qkv::tasks
