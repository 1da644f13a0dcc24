#include "train/token_shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>

#include "engine/error.h"

namespace remat {

namespace {

constexpr char kMagic[8] = {'R', 'M', 'T', 'O', 'K', 'E', 'N', '1'};
constexpr std::size_t kHeader = 64;

void put_u32(unsigned char* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u64(unsigned char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
std::uint64_t get_u64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}
std::uint32_t get_u32(const unsigned char* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

std::string errno_text() { return std::strerror(errno); }

void write_all(int fd, const void* data, std::size_t n, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    REMAT_CHECK(w > 0, IOError, "tokenize: writing ", path, " failed: ", errno_text());
    p += w;
    n -= std::size_t(w);
  }
}

std::string shard_name(std::size_t i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "shard-%05zu.tok", i);
  return buf;
}

}  // namespace

struct ShardWriter::Open {
  int fd = -1;
  std::string tmp, path;
  std::int64_t count = 0, docs = 0;
  std::vector<unsigned char> buf;  // pending tokens
};

ShardWriter::ShardWriter(std::string dir, std::int64_t vocab, std::string tokenizer_hash, std::int64_t eos,
                         std::int64_t tokens_per_shard)
    : dir_(std::move(dir)), hash_(std::move(tokenizer_hash)), vocab_(vocab), eos_(eos),
      per_shard_(tokens_per_shard), width_(vocab <= 65536 ? 2 : 4) {
  namespace fs = std::filesystem;
  REMAT_CHECK(vocab > 0 && vocab <= (std::int64_t(1) << 32), Error, "ShardWriter: vocabulary ", vocab,
              " (expected 1 .. 2^32)");
  REMAT_CHECK(hash_.size() == 16, Error, "ShardWriter: tokenizer hash '", hash_, "' (expected 16 hex digits)");
  REMAT_CHECK(per_shard_ > 0, Error, "ShardWriter: tokens_per_shard must be > 0");
  std::error_code ec;
  fs::create_directories(dir_, ec);
  REMAT_CHECK(!ec && fs::is_directory(dir_), IOError, "tokenize: --out ", dir_, ": cannot create the folder (",
              ec.message(), ")");
  // Shards must not mix with other files: a reader takes every *.tok file of
  // the folder, and a user's files must not be overwritten or mistaken.
  for (const auto& e : fs::directory_iterator(dir_))
    REMAT_CHECK(false, IOError, "tokenize: --out ", dir_, " is not empty (it holds ", e.path().filename().string(),
                e.path().extension() == ".tok" ? ", a shard" : "", "); give an empty or new folder");
}

ShardWriter::~ShardWriter() {
  try {
    close();
  } catch (const std::exception&) {
  }
}

void ShardWriter::roll() {
  if (open_) finish_shard();
  open_ = std::make_unique<Open>();
  open_->path = (std::filesystem::path(dir_) / shard_name(files_.size())).string();
  open_->tmp = open_->path + ".tmp";
  open_->fd = ::open(open_->tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  REMAT_CHECK(open_->fd >= 0, IOError, "tokenize: cannot create ", open_->tmp, ": ", errno_text());
  const std::vector<unsigned char> zeros(kHeader, 0);
  write_all(open_->fd, zeros.data(), zeros.size(), open_->tmp);  // the header, written last
}

void ShardWriter::finish_shard() {
  Open& o = *open_;
  if (!o.buf.empty()) write_all(o.fd, o.buf.data(), o.buf.size(), o.tmp);
  unsigned char h[kHeader] = {};
  std::memcpy(h, kMagic, 8);
  put_u32(h + 8, std::uint32_t(width_));
  put_u64(h + 16, std::uint64_t(o.count));
  put_u64(h + 24, std::uint64_t(vocab_));
  std::memcpy(h + 32, hash_.data(), 16);
  put_u64(h + 48, std::uint64_t(eos_));
  put_u64(h + 56, std::uint64_t(o.docs));
  REMAT_CHECK(::pwrite(o.fd, h, kHeader, 0) == ssize_t(kHeader), IOError, "tokenize: writing the header of ", o.tmp,
              " failed: ", errno_text());
  REMAT_CHECK(::fsync(o.fd) == 0, IOError, "tokenize: fsync of ", o.tmp, " failed: ", errno_text());
  ::close(o.fd);
  o.fd = -1;
  REMAT_CHECK(::rename(o.tmp.c_str(), o.path.c_str()) == 0, IOError, "tokenize: renaming ", o.tmp, " to ", o.path,
              " failed: ", errno_text());
  files_.push_back(o.path);
  open_.reset();
}

void ShardWriter::add_document(const std::vector<std::int32_t>& ids) {
  auto put = [&](std::int64_t id) {
    if (!open_ || open_->count == per_shard_) roll();
    Open& o = *open_;
    for (int i = 0; i < width_; ++i) o.buf.push_back(static_cast<unsigned char>(std::uint64_t(id) >> (8 * i)));
    ++o.count;
    ++total_;
    if (o.buf.size() >= (std::size_t(1) << 20)) {
      write_all(o.fd, o.buf.data(), o.buf.size(), o.tmp);
      o.buf.clear();
    }
  };
  for (const std::int32_t id : ids) {
    REMAT_CHECK(id >= 0 && id < vocab_, Error, "tokenize: token id ", id, " outside the vocabulary [0, ", vocab_,
                ")");
    put(id);
  }
  if (eos_ >= 0) put(eos_);
  if (open_) ++open_->docs;
  ++docs_;
}

void ShardWriter::close() {
  if (open_) finish_shard();
}

ShardInfo read_shard_header(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REMAT_CHECK(fd >= 0, IOError, "--data: cannot open ", path, ": ", errno_text());
  char h[kHeader];
  const ssize_t n = ::pread(fd, h, kHeader, 0);
  struct stat st {};
  ::fstat(fd, &st);
  ::close(fd);
  return parse_shard_header(std::string_view(h, n > 0 ? std::size_t(n) : 0), std::uint64_t(st.st_size), path);
}

ShardInfo parse_shard_header(std::string_view head, std::uint64_t file_size, const std::string& path) {
  REMAT_CHECK(head.size() >= kHeader && std::memcmp(head.data(), kMagic, 8) == 0, IOError, "--data: ", path,
              " is not a token shard (no RMTOKEN1 header; make shards with ./remat tokenize)");
  const auto* h = reinterpret_cast<const unsigned char*>(head.data());
  ShardInfo s;
  s.path = path;
  const std::uint32_t width = get_u32(h + 8);
  const std::uint64_t count = get_u64(h + 16), vocab = get_u64(h + 24), eos = get_u64(h + 48);
  s.tokenizer_hash.assign(reinterpret_cast<const char*>(h + 32), 16);
  s.documents = std::int64_t(get_u64(h + 56));
  REMAT_CHECK(width == 2 || width == 4, IOError, "--data: ", path, " has ", width, "-byte tokens (expected 2 or 4)");
  // The token bytes of a count this large do not fit 64 bits: no file has them.
  const bool fits = count <= (UINT64_MAX - kHeader) / width;
  const std::uint64_t want = fits ? kHeader + count * width : 0;
  REMAT_CHECK(fits && file_size == want, IOError, "--data: ", path, " is ", file_size, " bytes but its header says ",
              count, " tokens of ", width, " bytes (", fits ? std::to_string(want) : std::string("over 2^64"),
              " bytes with the header): truncated or not a shard");
  REMAT_CHECK(vocab >= 1 && vocab <= (std::uint64_t(1) << 32), IOError, "--data: ", path, " has vocabulary ", vocab,
              " in its header (expected 1 .. 2^32): not a shard made by ./remat tokenize");
  REMAT_CHECK(eos == UINT64_MAX || eos < vocab, IOError, "--data: ", path, " has EOS id ", std::int64_t(eos),
              " in its header, outside its vocabulary of ", vocab, " (expected -1 or 0 .. ", vocab - 1,
              "): not a shard made by ./remat tokenize");
  s.token_bytes = int(width);
  s.count = std::int64_t(count);
  s.vocab = std::int64_t(vocab);
  s.eos = std::int64_t(eos);
  return s;
}

std::shared_ptr<MappedShards> MappedShards::open(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path))
      if (e.path().extension() == ".tok") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    REMAT_CHECK(!files.empty(), IOError, "--data: ", path, " holds no token shards (*.tok; make them with ./remat tokenize)");
  } else {
    files.push_back(path);
  }
  std::shared_ptr<MappedShards> m(new MappedShards());
  for (const auto& f : files) {
    ShardInfo s = read_shard_header(f);
    if (!m->info_.empty()) {
      const ShardInfo& a = m->info_.front();
      REMAT_CHECK(s.vocab == a.vocab && s.tokenizer_hash == a.tokenizer_hash, IOError, "--data: ", f,
                  " was made with tokenizer ", s.tokenizer_hash, " (vocabulary ", s.vocab, "), but ", a.path,
                  " with ", a.tokenizer_hash, " (vocabulary ", a.vocab, ")");
    }
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    REMAT_CHECK(fd >= 0, IOError, "--data: cannot open ", f, ": ", errno_text());
    Map map;
    map.length = kHeader + std::size_t(s.count) * std::size_t(s.token_bytes);
    map.addr = ::mmap(nullptr, map.length, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    REMAT_CHECK(map.addr != MAP_FAILED, IOError, "--data: cannot map ", f, ": ", errno_text());
    m->maps_.push_back(map);
    m->info_.push_back(std::move(s));
  }
  return m;
}

MappedShards::~MappedShards() {
  for (const auto& m : maps_) ::munmap(m.addr, m.length);
}

std::int64_t MappedShards::tokens() const {
  std::int64_t n = 0;
  for (const auto& s : info_) n += s.count;
  return n;
}

TokenSpan MappedShards::span(std::size_t i) const {
  TokenSpan t;
  t.data = static_cast<const unsigned char*>(maps_.at(i).addr) + kHeader;
  t.count = info_.at(i).count;
  t.width = info_.at(i).token_bytes;
  return t;
}

TokenSource MappedShards::train(double val_fraction) const {
  TokenSource out;
  for (std::size_t i = 0; i < info_.size(); ++i) {
    TokenSpan t = span(i);
    t.count -= std::int64_t(double(t.count) * val_fraction);
    out.push_back(t);
  }
  return out;
}

TokenSource MappedShards::val(double val_fraction) const {
  TokenSource out;
  for (std::size_t i = 0; i < info_.size(); ++i) {
    TokenSpan t = span(i);
    const std::int64_t nval = std::int64_t(double(t.count) * val_fraction);
    t.data = static_cast<const unsigned char*>(t.data) + std::size_t(t.count - nval) * std::size_t(t.width);
    t.count = nval;
    out.push_back(t);
  }
  return out;
}

}  // namespace remat
