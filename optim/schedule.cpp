#include "qkv/optim/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace qkv::optim {

namespace {

Schedule checked(Schedule s) {
  if (!(s.lr >= 0) || !std::isfinite(s.lr)) fail("Schedule", "invalid lr {}", s.lr);
  if (!(s.min_lr >= 0 && s.min_lr <= s.lr)) fail("Schedule", "min_lr {} must be in [0, lr = {}]", s.min_lr, s.lr);
  if ((s.kind == Schedule::Kind::linear_warmup || s.kind == Schedule::Kind::warmup_cosine) && s.warmup_steps == 0)
    fail("Schedule", "warmup_steps must be positive");
  if ((s.kind == Schedule::Kind::cosine || s.kind == Schedule::Kind::warmup_cosine) && s.total_steps <= s.warmup_steps)
    fail("Schedule", "total_steps {} must exceed warmup_steps {}", s.total_steps, s.warmup_steps);
  return s;
}

}  // namespace

Schedule Schedule::constant(double lr) { return checked({.kind = Kind::constant, .lr = lr}); }

Schedule Schedule::linear_warmup(double lr, std::size_t warmup_steps) {
  return checked({.kind = Kind::linear_warmup, .lr = lr, .warmup_steps = warmup_steps});
}

Schedule Schedule::cosine(double lr, std::size_t total_steps, double min_lr) {
  return checked({.kind = Kind::cosine, .lr = lr, .min_lr = min_lr, .total_steps = total_steps});
}

Schedule Schedule::warmup_cosine(double lr, std::size_t warmup_steps, std::size_t total_steps, double min_lr) {
  return checked({.kind = Kind::warmup_cosine, .lr = lr, .min_lr = min_lr, .warmup_steps = warmup_steps,
                  .total_steps = total_steps});
}

double Schedule::lr_at(std::size_t step) const {
  if ((kind == Kind::linear_warmup || kind == Kind::warmup_cosine) && step < warmup_steps)
    return lr * double(step + 1) / double(warmup_steps);
  if (kind == Kind::constant || kind == Kind::linear_warmup) return lr;
  const std::size_t start = kind == Kind::warmup_cosine ? warmup_steps : 0;
  const double progress = std::min(1.0, double(step - start) / double(total_steps - start));
  return min_lr + (lr - min_lr) * 0.5 * (1 + std::cos(std::numbers::pi * progress));
}

}  // namespace qkv::optim
