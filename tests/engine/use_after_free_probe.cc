// The child of tests/engine/use_after_free_test.cc: frees a tensor into the
// CPU caching allocator's cache, then touches its storage through the
// dangling pointer. Built with ASan, the touch is reported and the program
// stops; otherwise it prints "probe: survived".
//
// Usage: use_after_free_probe write|read|live
//   write  writes one f32 through the dangling pointer
//   read   reads one
//   live   writes through the pointer while the tensor still lives (the
//          control: this one must survive)
#include <cstdio>
#include <cstring>

#include "engine/tensor.h"

int main(int argc, char** argv) {
  const char* mode = argc == 2 ? argv[1] : "";
  if (std::strcmp(mode, "write") != 0 && std::strcmp(mode, "read") != 0 &&
      std::strcmp(mode, "live") != 0) {
    std::fprintf(stderr, "usage: use_after_free_probe write|read|live\n");
    return 2;
  }
  remat::Tensor t = remat::zeros({256});
  volatile float* element = t.data<float>() + 100;  // byte 400 of a 1024-byte block
  if (std::strcmp(mode, "live") != 0) t = remat::Tensor();  // freed into the cache
  float seen = 0.0f;
  if (std::strcmp(mode, "read") == 0)
    seen = *element;
  else
    *element = 1.5f;
  std::printf("probe: survived (%s, read %g)\n", mode, double(seen));
  return 0;
}
