// `line`: an acyclic relation, v → v + 1 (RelationTask), which a symmetric score can rank.
#include "qkv/tasks/builtin.hpp"

namespace qkv::cli {

TaskSpec line_task() { return RelationTask::spec(false); }

}  // namespace qkv::cli
