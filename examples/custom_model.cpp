// A model of your own, built from remat's block-stack interface so that every recompute
// plan applies to it: ./custom_model [PLAN] (default none; e.g. per_block, uniform:2,
// selective:mlp, selective:save_matmul). Learns the next byte of a repeating pattern.
#include <cstdio>
#include <remat/remat.h>
using namespace remat;

// x -> x + mlp(norm(x)), offering the sub-regions "norm" and "mlp" to plans.
class ResidualMLP : public Block {
 public:
  ResidualMLP(std::int64_t dim, Generator& gen) {
    norm = register_module("norm", std::make_shared<RMSNorm>(dim, 1e-5));
    mlp = register_module("mlp", std::make_shared<MLP>(dim, 4 * dim, 0.02, gen));
  }
  Tensor forward(const Tensor& x) const override {
    Tensor n = region("norm", [this](const Tensor& t) { return norm->forward(t); }, x);
    return add(x, region("mlp", [this](const Tensor& t) { return mlp->forward(t); }, n));
  }
  std::vector<std::string> sub_regions() const override { return {"norm", "mlp"}; }
  std::shared_ptr<RMSNorm> norm; std::shared_ptr<MLP> mlp;
};

int main(int argc, char** argv) try {
  struct Net : Module {  // embed -> blocks.0 ... blocks.3 -> head
    Net() {
      Generator g(0);
      embed = register_module("embed", std::make_shared<Embedding>(256, 64, 0.02, g));
      blocks = register_module("blocks", std::make_shared<BlockStack>());
      for (int i = 0; i < 4; ++i) blocks->add_block(std::to_string(i), std::make_shared<ResidualMLP>(64, g));
      head = register_module("head", std::make_shared<Linear>(64, 256, 0.02, g));
    }
    std::shared_ptr<Embedding> embed;
    std::shared_ptr<BlockStack> blocks;
    std::shared_ptr<Linear> head;
  } net;
  net.blocks->set_plan(argc > 1 ? argv[1] : "none");
  std::printf("plan %s\n", net.blocks->plan().spec.c_str());
  AdamW opt(net.named_parameters());
  const std::string text = "remat trades memory for compute. ";
  std::vector<std::int64_t> ids, next;
  for (std::size_t i = 0; i < 8 * 64; ++i) ids.push_back(text[i % text.size()]);
  for (std::size_t i = 0; i < 8 * 64; ++i) next.push_back(text[(i + 1) % text.size()]);
  Tensor x = from_vector<std::int64_t>(ids, {8, 64}), y = from_vector<std::int64_t>(next, {8, 64});
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    net.zero_grad();
    Tensor loss = cross_entropy(net.head->forward(net.blocks->forward(net.embed->forward(x))), y);
    loss.backward();
    opt.step(3e-3);
    last = loss.item();
    if (step == 0) first = last;
  }
  std::printf("loss first %.4f last %.4f\npeak allocated %lld bytes\n", first, last,
              static_cast<long long>(allocator_for(kCPU).stats().allocated_peak));
  return last < first ? 0 : 1;
} catch (const Error& e) {  // e.g. a bad plan: the message names the fault and the valid plans
  std::fprintf(stderr, "custom_model: %s\n", e.what());
  return 2;
}
