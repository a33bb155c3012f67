#include "qkv/analysis/path_patching.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "qkv/core/autograd.hpp"
#include "qkv/core/ops.hpp"
#include <xtensor/xbuilder.hpp>
#include <xtensor/xview.hpp>

namespace qkv::analysis {

namespace {

std::string attn_point(std::size_t layer, const char* name) { return fmt::format("blocks.{}.attn.hook_{}", layer, name); }

// 1 at head `head` of dimension 2 of an activation of `shape` (B, T, H, d), broadcast over the rest.
Tensor head_mask(const Shape& shape, std::size_t head, DType dtype) {
  Array<double> mask = xt::zeros<double>(Shape{1, 1, shape[2], 1});
  mask(0, 0, head, 0) = 1;
  return Tensor(mask).to(dtype);
}

// value with head `head` (dimension 2) taken from `from`.
Tensor with_head(const Tensor& value, const Tensor& from, std::size_t head) {
  const Tensor take = head_mask(value.shape(), head, value.dtype());
  return value + (from - value) * take;
}

}  // namespace

PathPatching path_patch(nn::Transformer& model, const tasks::Task& task, const tasks::Corruption& corruption,
                        const PathPatchOptions& o) {
  const PatchPair pair = patch_pair(model, task, corruption, o.sequences, o.seed, o.mask_padding);
  const std::size_t L = model.blocks.size();
  PathPatching r;
  r.task = task.info().name;
  r.corruption = corruption.description;
  r.direction = o.noising ? "noising" : "denoising";
  r.sequences = pair.clean.tokens.shape()[0];
  r.length = pair.clean.tokens.shape()[1];
  r.seed = o.seed;

  NoGradGuard no_grad;
  std::vector<std::string> z_points;
  for (std::size_t l = 0; l < L; ++l) z_points.push_back(attn_point(l, "z"));
  const nn::ActivationCache clean = model.run_with_cache(pair.clean.tokens, z_points, pair.clean_mask);
  const nn::ActivationCache corrupt = model.run_with_cache(pair.corrupt.tokens, z_points, pair.corrupt_mask);
  r.clean = score_patch(model, clean.output, pair.clean);
  r.corrupted = score_patch(model, corrupt.output, pair.clean);
  // Noising runs the clean tokens with the sender's corrupted output; denoising the other way round.
  const IndexArray& tokens = o.noising ? pair.clean.tokens : pair.corrupt.tokens;
  const MaskArray& mask = o.noising ? pair.clean_mask : pair.corrupt_mask;
  const nn::ActivationCache& base = o.noising ? clean : corrupt;
  const nn::ActivationCache& source = o.noising ? corrupt : clean;

  for (std::size_t sl = 0; sl < L; ++sl) {
    const std::size_t heads = base[z_points[sl]].shape()[2];
    for (std::size_t sh = 0; sh < heads; ++sh) {
      // Step 1: the sender from the source run, every later head held at the base run.
      nn::NamedHooks hooks;
      hooks.emplace_back(z_points[sl], [&, sl, sh](const Tensor& z, const std::string&) {
        return with_head(z, source[z_points[sl]], sh);
      });
      std::vector<std::string> inputs;
      for (std::size_t l = sl + 1; l < L; ++l) {
        hooks.emplace_back(z_points[l], [&, l](const Tensor&, const std::string&) { return base[z_points[l]]; });
        for (const char* x : {"q", "k", "v"}) inputs.push_back(attn_point(l, x));
      }
      nn::Activations received;
      for (const std::string& point : inputs)
        hooks.emplace_back(point, [&received](const Tensor& value, const std::string& name) {
          received.activations.emplace_back(name, value.detach());
          return value;
        });
      const nn::TransformerOutput direct = model.run_with_hooks(tokens, hooks, false, mask);
      r.paths.push_back({sl, sh, L, 0, "logits", 0, score_patch(model, direct, pair.clean)});
      // Step 2: one receiver's q, k or v from step 1, in the base run.
      for (std::size_t l = sl + 1; l < L; ++l)
        for (std::size_t h = 0; h < heads; ++h)
          for (const char* x : {"q", "k", "v"}) {
            const std::string point = attn_point(l, x);
            const Tensor& from = received[point];
            // q has a slice per head; k and v one per kv head, which the heads of its group share:
            // patched once, for the group's first head.
            const std::size_t slice = std::string(x) == "q" ? h : model.blocks[l]->attn.kv_head_of(h);
            const auto same = std::find_if(r.paths.begin(), r.paths.end(), [&](const PathPatching::Path& p) {
              return p.sender_layer == sl && p.sender_head == sh && p.receiver_layer == l && p.input == x &&
                     p.receiver_slice == slice;
            });
            if (same != r.paths.end()) {
              r.paths.push_back({sl, sh, l, h, x, slice, same->patched});
              continue;
            }
            const nn::ForwardHook replace = [&](const Tensor& value, const std::string&) { return with_head(value, from, slice); };
            const nn::TransformerOutput out = model.run_with_hooks(tokens, {{point, replace}}, false, mask);
            r.paths.push_back({sl, sh, l, h, x, slice, score_patch(model, out, pair.clean)});
          }
    }
  }
  return r;
}

}  // namespace qkv::analysis
