// The experiments the program knows, in the order `qkv experiment --help` lists them. Experiment
// NAME is defined in experiments/NAME.cpp as `ExperimentSpec NAME_experiment()`; a new one is that
// file and its name on this line:
#define QKV_EXPERIMENTS(EXPERIMENT) EXPERIMENT(ablations) EXPERIMENT(dhead) EXPERIMENT(scale) EXPERIMENT(kv) EXPERIMENT(causal) EXPERIMENT(symmetry) EXPERIMENT(length) EXPERIMENT(masks)

#include "qkv/experiments/experiment.hpp"

namespace qkv::experiments {

using namespace tasks;
using namespace training;

#define QKV_DECLARE_EXPERIMENT(name) ExperimentSpec name##_experiment();
QKV_EXPERIMENTS(QKV_DECLARE_EXPERIMENT)

const std::vector<ExperimentSpec>& experiment_registry() {
#define QKV_EXPERIMENT_SPEC(name) name##_experiment(),
  static const std::vector<ExperimentSpec> experiments = {QKV_EXPERIMENTS(QKV_EXPERIMENT_SPEC)};
  return experiments;
}

}  // namespace qkv::experiments
