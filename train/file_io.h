// Small POSIX file helpers shared by the safetensors, state and Hugging Face
// file code (train/safetensors.cc, train/hf_files.cc, train/hf_model.cc).
#pragma once

#include <cstddef>
#include <string>

namespace remat::file_io {

// strerror(errno), for messages.
std::string errno_text();

// Owns a file descriptor: closed when it goes, as the OS would on a crash.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
};

// Writes all `n` bytes at `p` to `fd` (pieces of at most 1 GiB, EINTR
// retried); false with errno set on failure.
bool write_all(int fd, const char* p, std::size_t n);

// The whole file as bytes; IOError naming it when it cannot be read.
std::string read_file(const std::string& path);

}  // namespace remat::file_io
