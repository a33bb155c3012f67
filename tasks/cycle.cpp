// `cycle`: a cyclic relation, v → v + 1 mod n (RelationTask), which no symmetric score can rank: at
// most n − 1 of a sequence's n queries can find their successor on top.
#include "qkv/tasks/builtin.hpp"

namespace qkv::tasks {

TaskSpec cycle_task() { return RelationTask::spec(true); }

}  // namespace qkv::tasks
