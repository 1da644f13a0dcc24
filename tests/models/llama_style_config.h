// The tied grouped-query Llama shape the model tests share: tiny with two
// key/value heads, a head dim (48) other than d / heads, tied embeddings
// (the LM head is the embedding) and attention biases.
#pragma once

#include "models/config.h"

namespace remat::testing {

inline ModelConfig llama_style_config() {
  ModelConfig llama = ModelConfig::named("tiny");
  llama.name = "llama-style";
  llama.arch = "llama";
  llama.kv_heads = 2;
  llama.head_size = 48;
  llama.tie_embeddings = true;
  llama.qkv_bias = llama.o_bias = true;
  return llama;
}

}  // namespace remat::testing
