#pragma once
// Learning-rate schedules as closed forms of the step (0-based), and how one drives an optimizer:
//
//   const Schedule s = Schedule::warmup_cosine(1e-3, 100, 2000, 1e-5);
//   for (std::size_t step = 0; step < 2000; ++step) { s.apply(opt, step); ...; opt.step(); }
#include <cstddef>

#include "qkv/optim/optimizer.hpp"

namespace qkv::optim {

struct Schedule {
  enum class Kind { constant, linear_warmup, cosine, warmup_cosine };

  // lr at every step.
  static Schedule constant(double lr);
  // lr · (step + 1) / warmup_steps during the first warmup_steps steps, then lr.
  static Schedule linear_warmup(double lr, std::size_t warmup_steps);
  // From lr at step 0 down to min_lr at total_steps along half a cosine, then min_lr:
  // min_lr + (lr − min_lr) · (1 + cos(π · step / total_steps)) / 2.
  static Schedule cosine(double lr, std::size_t total_steps, double min_lr = 0);
  // linear_warmup for warmup_steps, then the cosine over the remaining total_steps − warmup_steps.
  static Schedule warmup_cosine(double lr, std::size_t warmup_steps, std::size_t total_steps, double min_lr = 0);

  double lr_at(std::size_t step) const;
  void apply(Optimizer& optimizer, std::size_t step) const { optimizer.set_lr(lr_at(step)); }

  Kind kind = Kind::constant;
  double lr = 1e-3, min_lr = 0;
  std::size_t warmup_steps = 0, total_steps = 0;
};

}  // namespace qkv::optim
