// A model of your own, trained with one checkpoint region per block.
// Learns to predict the next byte of a repeating pattern; prints the loss as
// it falls and the peak memory.
#include <cstdio>
#include <remat/remat.h>

using namespace remat;

// Embedding -> N residual MLP blocks (each a checkpoint region) -> head.
class TinyNet : public Module {
 public:
  TinyNet(std::int64_t vocab, std::int64_t dim, int blocks, Generator& gen) {
    embed = register_module("embed", std::make_shared<Embedding>(vocab, dim, 0.02, gen));
    for (int i = 0; i < blocks; ++i) {
      norms.push_back(register_module("norm." + std::to_string(i), std::make_shared<RMSNorm>(dim, 1e-5)));
      mlps.push_back(register_module("mlp." + std::to_string(i), std::make_shared<MLP>(dim, 4 * dim, 0.02, gen)));
    }
    head = register_module("head", std::make_shared<Linear>(dim, vocab, 0.02, gen));
  }
  Tensor loss(const Tensor& ids, const Tensor& targets) const {
    Tensor h = embed->forward(ids);
    for (std::size_t i = 0; i < mlps.size(); ++i)
      h = checkpoint([this, i](const Tensor& x) { return add(x, mlps[i]->forward(norms[i]->forward(x))); }, h);
    return cross_entropy(head->forward(h), targets);
  }
  std::shared_ptr<Embedding> embed;
  std::vector<std::shared_ptr<RMSNorm>> norms;
  std::vector<std::shared_ptr<MLP>> mlps;
  std::shared_ptr<Linear> head;
};

int main() {
  Generator gen(0);
  TinyNet net(256, 64, 4, gen);
  AdamW opt(net.named_parameters());
  const std::string text = "remat trades memory for compute. ";
  std::vector<std::int64_t> ids, next;
  for (int i = 0; i < 8 * 64; ++i) {
    ids.push_back(text[std::size_t(i) % text.size()]);
    next.push_back(text[std::size_t(i + 1) % text.size()]);
  }
  Tensor x = from_vector<std::int64_t>(ids, {8, 64}), y = from_vector<std::int64_t>(next, {8, 64});
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    net.zero_grad();
    Tensor loss = net.loss(x, y);
    loss.backward();
    opt.step(3e-3);
    last = loss.item();
    if (step == 0) first = last;
    if (step % 20 == 0 || step == 59) std::printf("step %2d  loss %.4f\n", step, last);
  }
  std::printf("loss first %.4f last %.4f\n", first, last);
  std::printf("peak allocated %lld bytes\n", static_cast<long long>(allocator_for(kCPU).stats().allocated_peak));
  return last < first ? 0 : 1;
}
