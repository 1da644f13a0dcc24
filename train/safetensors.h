// safetensors files, read and written by remat's own code: an 8-byte
// little-endian header length, a JSON header mapping each name to its dtype,
// shape and byte range, then the raw little-endian tensor data.
//
// Integrity (remat's extension, inside the standard "__metadata__" object,
// whose values are strings, so other readers see two ordinary keys):
//   "checksum_algorithm": "xxh3-64"
//   "checksums": a JSON object, as a string, mapping every tensor name to the
//                XXH3-64 hash of that tensor's bytes in the file, as 16
//                lowercase hex digits, e.g. {"w":"0123456789abcdef"}.
// Files carry both keys or neither; with them, every tensor has exactly one
// entry. Files without them (written before checksums existed, or by other
// programs) still load, and SafetensorsFile::checksummed says which it was.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/tensor.h"

namespace remat {

inline constexpr const char* kChecksumAlgorithm = "xxh3-64";
inline constexpr const char* kChecksumAlgorithmKey = "checksum_algorithm";
inline constexpr const char* kChecksumsKey = "checksums";

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;            // CPU tensors
  std::map<std::string, std::string> metadata;      // "__metadata__" without the two checksum keys
  bool checksummed = false;  // the file carried checksums and every tensor matched its own
};

struct SafetensorsWriteOptions {
  bool checksums = true;  // record every tensor's XXH3-64 in "__metadata__" (see above)
};

// XXH3-64 (seed 0) of `n` bytes at `data`.
std::uint64_t xxh3_64(const void* data, std::size_t n);

// The bytes of a safetensors file holding `tensors` (any device; copied to
// host; written in this order) and `metadata`. Names must be unique and
// non-empty; the metadata may not use the checksum keys. Throws IOError
// naming `what` (the destination, for messages).
std::string encode_safetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata = {},
                               const SafetensorsWriteOptions& options = {}, const std::string& what = "safetensors");

// Writes encode_safetensors(tensors, metadata, options) to `path` atomically:
// a temporary file in the same folder, fsync, rename over `path`, fsync of the
// folder. Throws IOError.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {},
                      const SafetensorsWriteOptions& options = {});

// Reads and validates the whole file before returning anything: header size
// and JSON, dtypes, shapes, byte ranges (in bounds, matching shape x dtype,
// non-overlapping, covering the data), the file length and, when the file has
// them, every tensor's checksum (all are checked before any tensor is built).
// Throws IOError naming the file and the problem (for a checksum mismatch:
// the tensor, its stored and its computed hash); never returns a partial result.
SafetensorsFile load_safetensors(const std::string& path);

// Writes `bytes` to `path` atomically (temporary file, fsync, rename, fsync of
// the folder). Throws IOError; on failure `path` is untouched.
void write_file_atomic(const std::string& path, const std::string& bytes);

// Creates or truncates `path`, writes `bytes` and fsyncs it (no rename).
// `halfway`, when set, runs once after the first half is written and before
// the rest (fault-injection tests use it to stop mid-write); an exception
// from it propagates and leaves the partial file, as a crash would. A write
// error removes the file and throws IOError naming it.
void write_file_synced(const std::string& path, std::string_view bytes,
                       const std::function<void()>& halfway = nullptr);

// fsyncs the folder `dir` so that renames and links in it are durable.
// Throws IOError when it cannot be opened or synced.
void fsync_dir(const std::string& dir);

}  // namespace remat
