#include "fuzz/fixture.hpp"

#include "qkv/core/ops.hpp"
#include "qkv/nn/safetensors.hpp"
#include "qkv/training/options.hpp"

namespace qkv::fuzz {

Fixture::Fixture() : options(tasks::default_options("brackets")) {
  options.out = "fuzz";
  options.model.layers = 1;
  options.model.heads = 1;
  options.model.d_model = 4;
  Generator gen(options.seed);
  model = std::make_unique<nn::Transformer>(options.model, gen);
  optimizer = std::make_unique<optim::Adam>(model->parameters(), optim::AdamOptions{.lr = options.lr});
  // One step on Σ‖p‖², whose gradients need no BLAS: the files are the same bytes on every machine.
  Tensor loss = scalar(0.0);
  for (const Tensor& p : model->parameters()) loss = loss + sum(p * p);
  loss.backward();
  optimizer->step();
  check = {.max_step = options.steps, .updated = std::vector<bool>(model->parameters().size(), true)};
  const auto& r = gen.state();
  config = training::config_text(options);
  model_file = nn::serialize_safetensors(model->state_dict(), {{"step", "1"}});
  optimizer_file = nn::serialize_safetensors(
      optimizer->state_dict(), {{"step", "1"}, {"rng", fmt::format("{} {} {} {}", r[0], r[1], r[2], r[3])}});
}

}  // namespace qkv::fuzz
