// The C++ half of tests/python/test_bit_identical_cpp.py: seeds remat's
// default generators, draws x [4,16], w1 [32,16] and w2 [16,32] with randn
// (in that order), runs y = checkpoint(block, x, w1, w2) with
// block = linear(silu(linear(x, w1)), w2), backward of sum(y * y), and
// writes the raw f32 bytes of x.grad, w1.grad and w2.grad (in that order)
// to the file named by argv[1]. The Python test does the same through the
// `remat` module and compares the bytes.
//
//   cpp_reference OUT_FILE [SEED] [reentrant]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <remat/remat.h>

using namespace remat;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s OUT_FILE [SEED] [reentrant]\n", argv[0]);
    return 2;
  }
  const std::uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1234;
  const bool reentrant = argc > 3 && std::string(argv[3]) == "reentrant";
  manual_seed(seed);
  Tensor x = randn({4, 16});
  Tensor w1 = randn({32, 16});
  Tensor w2 = randn({16, 32});
  for (Tensor* t : {&x, &w1, &w2}) t->set_requires_grad(true);

  CheckpointOptions opts;
  opts.reentrant = reentrant;
  const RegionFn block = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{linear(silu(linear(in[0], in[1])), in[2])};
  };
  const Tensor y = checkpoint(block, {x, w1, w2}, opts)[0];
  sum(y * y).backward();

  std::FILE* f = std::fopen(argv[1], "wb");
  if (!f) {
    std::perror(argv[1]);
    return 1;
  }
  for (const Tensor* t : {&x, &w1, &w2}) {
    const std::vector<float> g = t->grad().contiguous().to_vector<float>();
    if (std::fwrite(g.data(), sizeof(float), g.size(), f) != g.size()) {
      std::perror("fwrite");
      return 1;
    }
  }
  return std::fclose(f) == 0 ? 0 : 1;
}
