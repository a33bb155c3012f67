#pragma once
// What the patching tests share: the induction model at init with its task and corruption, and
// the metrics of a run scored as patching scores it.
#include <memory>

#include "qkv/analysis/detail/tally.hpp"
#include "qkv/analysis/patching.hpp"
#include "qkv/tasks/builtin.hpp"
#include "qkv/tasks/registry.hpp"
#include "tests/helpers.hpp"

namespace qkv::test {

// The induction model at init, two heads a layer, in float64, drawn from `seed`.
inline std::unique_ptr<nn::Transformer> induction_model(std::uint64_t seed, bool mlp = false) {
  nn::TransformerConfig c = tasks::default_options("induction").model;
  c.heads = 2;
  c.mlp = mlp;
  c.dtype = DType::float64;
  Generator gen(seed);
  return std::make_unique<nn::Transformer>(c, gen);
}

// The induction model at init (induction_model), its task and the task's corruption.
struct Induction {
  explicit Induction(std::uint64_t seed) : model(induction_model(seed)) {}
  std::unique_ptr<nn::Transformer> model;
  tasks::InductionTask task;
  tasks::Corruption corruption = *tasks::task_spec("induction").corruption;
};

inline analysis::PatchScore scored(const nn::Transformer& model, const nn::TransformerOutput& out, const tasks::Batch& batch) {
  analysis::detail::Tally t;
  t.add(model, out, batch, true);
  return {t.accuracy(), t.loss(), t.logit_diff()};
}

inline void check_same(const analysis::PatchScore& a, const analysis::PatchScore& b) {
  CHECK(a.accuracy == b.accuracy);
  CHECK(a.loss == Approx(b.loss).epsilon(1e-12));
  CHECK(a.logit_diff == Approx(b.logit_diff).epsilon(1e-12));
}

}  // namespace qkv::test
