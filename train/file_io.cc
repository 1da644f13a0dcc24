#include "train/file_io.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "engine/error.h"

namespace remat::file_io {

std::string errno_text() { return std::strerror(errno); }

Fd::~Fd() {
  if (fd >= 0) ::close(fd);
}

bool write_all(int fd, const char* p, std::size_t n) {
  std::size_t done = 0;
  while (done < n) {
    const ssize_t k = ::write(fd, p + done, std::min<std::size_t>(n - done, std::size_t(1) << 30));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      if (k == 0) errno = EIO;
      return false;
    }
    done += std::size_t(k);
  }
  return true;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REMAT_CHECK(in.good(), IOError, "cannot open ", path);
  std::ostringstream os;
  os << in.rdbuf();
  REMAT_CHECK(!in.bad(), IOError, "reading ", path, " failed");
  return os.str();
}

}  // namespace remat::file_io
