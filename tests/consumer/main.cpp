// One attention layer learns to copy the previous token: the loss must fall.
#include <cstdio>

#include <qkv/core/ops.hpp>
#include <qkv/nn/attention.hpp>
#include <qkv/optim/adam.hpp>
#include <qkv/version.hpp>

int main() {
  using namespace qkv;
  manual_seed(0);
  nn::MultiHeadAttention attention({.d_model = 8, .n_heads = 2});
  optim::AdamW opt(attention.parameters(), {.lr = 1e-2});
  const Tensor x = randn({4, 6, 8});                        // (B, T, d_model)
  const Tensor previous = slice(x, 1, 0, 5);                // position t should output x[t − 1]
  double first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    opt.zero_grad();
    const Tensor y = slice(attention.forward(x, {.causal = true}).output, 1, 1, 6);
    const Tensor loss = mean(pow(y - previous, 2.0));
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item();
  }
  std::printf("qkv %s: loss %.4f -> %.4f\n", QKV_VERSION, first, last);
  return last < 0.5 * first ? 0 : 1;
}
