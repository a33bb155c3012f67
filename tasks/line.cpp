// `line`: an acyclic relation, v → v + 1 (RelationTask), which a symmetric score can rank.
#include "qkv/tasks/builtin.hpp"

namespace qkv::tasks {

TaskSpec line_task() { return RelationTask::spec(false); }

}  // namespace qkv::tasks
