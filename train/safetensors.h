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
//
// load_safetensors reads a whole file; SafetensorsReader reads the header
// once and then one tensor at a time, so memory holds the header and the
// tensors asked for, never the file.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/error.h"
#include "engine/tensor.h"

namespace remat {

class Json;

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

// A dtype's name in safetensors headers: "F32", "BF16", "F16", "I32", "I64",
// "BOOL", "F8_E4M3".
const char* safetensors_dtype(DType t);

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
// them, every tensor's checksum. Throws IOError naming the file and the
// problem (for a checksum mismatch: the tensor, its stored and its computed
// hash); never returns a partial result. Reads through SafetensorsReader:
// memory holds the tensors, not a copy of the file besides.
SafetensorsFile load_safetensors(const std::string& path);

// load_safetensors of a file held in memory: the same checks and results,
// the same errors with `what` in place of the path.
SafetensorsFile decode_safetensors(std::string_view bytes, const std::string& what);

// One safetensors file, read a tensor at a time. The constructor reads and
// validates the header only (everything load_safetensors checks except the
// checksums' values: header length (at most 100 MB, the format's limit) and
// JSON, dtypes, shapes, byte ranges in bounds / matching shape x dtype /
// non-overlapping / covering the data section, the file length, and the form
// of the checksum keys) and keeps the file open; read() then pread()s just
// one tensor's bytes and, when the file carries checksums, verifies that
// tensor's hash. Errors are IOError naming the file and the problem.
// read() is const and safe to call from several threads at once. Movable,
// not copyable; the file is closed with the last owner.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(std::string path);
  // The same reader over a file's bytes in memory (`bytes` must outlive it);
  // `what` stands for the path in errors and path().
  static SafetensorsReader from_bytes(std::string_view bytes, std::string what);

  const std::string& path() const { return path_; }
  // Tensor names, sorted.
  std::vector<std::string> names() const;
  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  // The stored dtype, shape and byte count of `name` (IOError if absent).
  DType dtype(const std::string& name) const;
  const Shape& shape(const std::string& name) const;
  std::size_t nbytes(const std::string& name) const;
  // "__metadata__" without the two checksum keys.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The file carries checksums (each read() verifies its tensor's).
  bool checksummed() const { return checksummed_; }

  // Tensor `name` as a new contiguous CPU tensor, in its stored dtype or in
  // `as`. as = f32 from bf16 / f16 widens exactly with no second copy (the
  // raw bytes land in the back half of the f32 tensor and widen in place);
  // any other pair of f32 / bf16 / f16 reads then casts (round to nearest
  // even); other dtype changes throw DTypeError. With checksums, the stored
  // bytes are hashed before any conversion; a mismatch throws IOError naming
  // the file, the tensor and both hashes. An unknown name throws IOError
  // naming the file and the tensor.
  Tensor read(const std::string& name, std::optional<DType> as = {}) const;
  // Reads tensor `name` into `dst` (a contiguous CPU tensor of its shape,
  // of its dtype, or f32 for a bf16 / f16 tensor: widened exactly in place),
  // with read()'s checks; a checksum mismatch leaves dst's contents unspecified.
  void read_into(const std::string& name, Tensor& dst) const;
  // Elements [begin, begin + dst.numel()) of the flattened tensor `name`
  // into `dst` (contiguous, CPU, its dtype or f32 from bf16 / f16): one
  // read of that byte range. Not checked against the tensor's checksum,
  // which covers the whole tensor (read_into verifies). DTypeError for a
  // range outside it or another dtype; IOError for a short read.
  void read_range_into(const std::string& name, std::int64_t begin, Tensor& dst) const;
  // Checks tensor `name`'s stored bytes against its checksum, reading them
  // in chunks of at most 8 MiB (nothing the size of the tensor is held); the
  // IOError read() throws on a mismatch. Nothing to check without checksums.
  // A tensor verified once is not hashed again by this reader (thread-safe).
  // Before read_range_into, this makes a range read as safe as read_into.
  void verify(const std::string& name) const;

 private:
  // Owns an open file descriptor.
  class Fd {
   public:
    Fd() = default;
    explicit Fd(int fd) : fd_(fd) {}
    Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
    Fd& operator=(Fd&& o) noexcept;
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    ~Fd();
    int get() const { return fd_; }

   private:
    int fd_ = -1;
  };
  struct Entry {
    DType dtype;
    Shape shape;
    std::uint64_t begin, end;  // in the data section
    std::optional<std::uint64_t> checksum;
  };
  SafetensorsReader(std::string what, std::string_view bytes);
  const Entry& entry(const std::string& name) const;
  // The size of the open file (IOError unless it is a regular file).
  std::uint64_t file_size() const;
  // The header checks both constructors share, on a file of `file_size` bytes.
  void parse(std::uint64_t file_size);
  // parse's steps, in order. Reads the header (its length, its JSON) and
  // fills entries_ and metadata_, each entry validated; returns the data
  // section's size.
  std::uint64_t read_header_into_entries(std::uint64_t file_size);
  // One header entry: dtype, shape and byte range checked against the data section.
  Entry parse_entry(const std::string& name, const Json& entry, std::uint64_t data_size) const;
  // The entries tile the data section exactly (no overlap, no hole).
  void check_data_layout(std::uint64_t data_size) const;
  // The checksum keys of __metadata__: their form here (each tensor's hash is
  // checked when it is read); taken out of metadata_.
  void read_checksums();
  // The IOError for tensor `name` whose bytes hash to `got`, not `want`.
  IOError checksum_mismatch(const std::string& name, std::uint64_t got, std::uint64_t want) const;
  // "PATH: not a valid safetensors file: WHY".
  IOError invalid(const std::string& why) const;
  // Reads exactly `n` bytes at file offset `at` into `dst` (pread, retried on
  // short reads and EINTR; a copy when in memory); `what` names them in errors.
  void read_bytes(void* dst, std::uint64_t n, std::uint64_t at, const std::string& what) const;

  std::string path_;
  Fd fd_;
  bool in_memory_ = false;
  std::string_view bytes_;  // the file's bytes when in_memory_
  std::uint64_t data_start_ = 0;  // file offset of the data section
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
  bool checksummed_ = false;
  struct Verified {
    std::mutex mu;
    std::set<std::string> names;
  };
  std::unique_ptr<Verified> verified_ = std::make_unique<Verified>();  // (verify()'s memory)
};

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
