// One attention head learns a directed relation: in a shuffled sequence of the tokens 0…5, each
// token must find its successor (t + 1 mod 6), a cycle that a symmetric score cannot rank.
// Trained with Adam on the head's pre-softmax scores; prints the loss and the learned QK table.
#include <algorithm>
#include <cstdio>

#include <qkv/core/ops.hpp>
#include <qkv/nn/attention.hpp>
#include <qkv/optim/adam.hpp>

using namespace qkv;

int main() {
  constexpr std::size_t n = 6, batch = 32;
  manual_seed(0);
  nn::MultiHeadAttention head({.d_model = n, .n_heads = 1, .d_head = 4, .qkv_bias = false});
  optim::Adam opt(head.parameters(), {.lr = 3e-2});
  Generator gen(1);
  double accuracy = 0;
  for (int step = 1; step <= 300; ++step) {
    // x: one-hot tokens in a random order; target: the position of each token's successor.
    Array<float> x = xt::zeros<float>({batch, n, n});
    IndexArray target = IndexArray::from_shape({batch * n});
    for (std::size_t b = 0; b < batch; ++b) {
      std::vector<std::size_t> order(n), where(n);
      for (std::size_t i = 0; i < n; ++i) order[i] = i;
      for (std::size_t i = n - 1; i > 0; --i) std::swap(order[i], order[gen.next_u64() % (i + 1)]);
      for (std::size_t i = 0; i < n; ++i) x(b, i, order[i]) = 1, where[order[i]] = i;
      for (std::size_t i = 0; i < n; ++i) target(b * n + i) = std::int64_t(where[(order[i] + 1) % n]);
    }
    opt.zero_grad();
    const Tensor scores = reshape(head.forward(Tensor(x), {}, true).scores, {-1, std::int64_t(n)});
    const Tensor loss = cross_entropy(scores, target);
    loss.backward();
    opt.step();
    const auto s = scores.value<float>();
    std::size_t right = 0;
    for (std::size_t r = 0; r < batch * n; ++r)
      right += std::size_t(std::max_element(&s(r, 0), &s(r, 0) + n) - &s(r, 0)) == std::size_t(target(r));
    accuracy = double(right) / double(batch * n);
    if (step % 100 == 0) std::printf("step %3d  loss %.4f  accuracy %.3f\n", step, loss.item(), accuracy);
  }
  // The QK table: the score query token a gives key token b, x_a W_q (x_b W_k)ᵀ, before 1/√d_head.
  const Tensor table = matmul(head.W_q(0), transpose(head.W_k(0), 0, 1));
  std::printf("QK table (row: query token, column: key token)\n");
  for (std::size_t a = 0; a < n; ++a) {
    for (std::size_t b = 0; b < n; ++b) std::printf("%7.2f", double(table.value<float>()(a, b)));
    std::printf("\n");
  }
  return accuracy > 0.99 ? 0 : 1;
}
