#include "qkv/tasks/builtin.hpp"

namespace qkv::tasks {

TaskSpec sort_task() {
  return seq2seq_spec("sort", [] { return std::make_unique<NumbersTask>(NumbersTask::Order::sorted, 32, 3, 12); }, 1, 3000);
}

}  // namespace qkv::tasks
