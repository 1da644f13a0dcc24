// safetensors files, read and written by remat's own code: an 8-byte
// little-endian header length, a JSON header mapping each name to its dtype,
// shape and byte range, then the raw little-endian tensor data.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"

namespace remat {

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;            // CPU tensors
  std::map<std::string, std::string> metadata;      // "__metadata__" (string values)
};

// Writes `tensors` (any device; copied to host) and `metadata` to `path`
// atomically: a temporary file in the same folder, fsync, rename over `path`,
// fsync of the folder. Names must be unique. Throws IOError.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads and validates the whole file before returning anything: header size
// and JSON, dtypes, shapes, byte ranges (in bounds, matching shape x dtype,
// non-overlapping, covering the data) and the file length. Throws IOError
// naming the file and the problem; never returns a partial result.
SafetensorsFile load_safetensors(const std::string& path);

// Writes `bytes` to `path` atomically (temporary file, fsync, rename).
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace remat
