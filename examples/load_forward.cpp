// Loads a model saved with Hugging Face parameter names (a `./remat dump` file
// or any safetensors file with the decoder's names and a "config" metadata
// entry) and runs a forward pass on the tokens it holds.
#include <cstdio>
#include <remat/remat.h>

using namespace remat;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s MODEL.safetensors\n", argv[0]);
    return 2;
  }
  try {
    SafetensorsFile f = load_safetensors(argv[1]);
    const ModelConfig config = ModelConfig::from_json(Json::parse(f.metadata.at("config"), "config"));
    DecoderModel model(config, 0);
    {
      NoGradGuard no_grad;
      for (auto& [name, p] : model.named_parameters()) {
        Tensor dst = p;
        dst.copy_(f.tensors.at(name));
      }
    }
    model.train(false);
    NoGradGuard no_grad;
    const Tensor tokens = f.tensors.at("batch.tokens");
    const Tensor logits = model.forward(tokens.narrow(1, 0, tokens.size(1) - 1).contiguous());
    const auto out = model.forward_loss(tokens);
    std::printf("logits %s\n", shape_str(logits.sizes()).c_str());
    std::printf("loss.ce %.6f\n", out.ce.item());
  } catch (const Error& e) {
    std::fprintf(stderr, "load_forward: %s\n", e.what());
    return 1;
  }
  return 0;
}
