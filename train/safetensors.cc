#include "train/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <vector>

#include "engine/json.h"
#include "train/file_io.h"

namespace remat {

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::boolean: return "BOOL";
    case DType::fp8_e4m3: return "F8_E4M3";
  }
  return "?";
}

namespace {

bool parse_st_dtype(const std::string& s, DType& out) {
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64, DType::boolean,
                  DType::fp8_e4m3})
    if (s == safetensors_dtype(t)) {
      out = t;
      return true;
    }
  return false;
}

using file_io::errno_text;
using file_io::Fd;
using file_io::write_all;

std::string dir_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

bool parse_hex64(const std::string& s, std::uint64_t& out) {
  if (s.size() != 16) return false;
  out = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return false;
    out = (out << 4) | std::uint64_t(d);
  }
  return true;
}



}  // namespace

std::uint64_t xxh3_64(const void* data, std::size_t n) { return XXH3_64bits(data, n); }

void fsync_dir(const std::string& dir) {
  Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY));
  REMAT_CHECK(d.fd >= 0, IOError, "cannot open the folder ", dir, " to sync it: ", errno_text());
  // EINVAL: the file system cannot sync folders (nothing more to do there).
  if (::fsync(d.fd) != 0 && errno != EINVAL) throw IOError("fsync of the folder " + dir + " failed: " + errno_text());
}

void write_file_synced(const std::string& path, std::string_view bytes, const std::function<void()>& halfway) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
  REMAT_CHECK(fd.fd >= 0, IOError, "cannot create ", path, ": ", errno_text());
  auto fail = [&](const std::string& what) {
    const std::string err = errno_text();
    ::unlink(path.c_str());
    throw IOError(what + " " + path + " failed: " + err);
  };
  const std::size_t half = halfway ? bytes.size() / 2 : bytes.size();
  if (!write_all(fd.fd, bytes.data(), half)) fail("writing");
  if (halfway) {
    halfway();  // an exception leaves the partial file, like a crash
    if (!write_all(fd.fd, bytes.data() + half, bytes.size() - half)) fail("writing");
  }
  if (::fsync(fd.fd) != 0) fail("fsync of");
  const int fdv = fd.fd;
  fd.fd = -1;
  if (::close(fdv) != 0) fail("closing");
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  write_file_synced(tmp, bytes);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = errno_text();
    ::unlink(tmp.c_str());
    throw IOError("cannot rename " + tmp + " to " + path + ": " + err);
  }
  fsync_dir(dir_of(path));  // make the rename itself durable
}

std::string encode_safetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata,
                               const SafetensorsWriteOptions& options, const std::string& what) {
  Json header = Json::object();
  Json sums = Json::object();
  std::set<std::string> names;
  std::vector<Tensor> host;
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    REMAT_CHECK(!name.empty() && name != "__metadata__", IOError, "safetensors: invalid tensor name '",
                name, "' for ", what);
    REMAT_CHECK(names.insert(name).second, IOError, "safetensors: duplicate tensor name '", name,
                "' for ", what);
    REMAT_CHECK(t.defined(), IOError, "safetensors: tensor '", name, "' for ", what, " is undefined");
    Tensor h = t.detach().to(kCPU).contiguous();
    Json shape = Json::array();
    for (auto s : h.sizes()) shape.push(Json::number(double(s)));
    Json entry = Json::object();
    entry.set("dtype", Json::string(safetensors_dtype(h.dtype())));
    entry.set("shape", shape);
    entry.set("data_offsets", Json::array({Json::number(double(offset)),
                                           Json::number(double(offset + h.nbytes()))}));
    header.set(name, entry);
    if (options.checksums) sums.set(name, Json::string(hex64(xxh3_64(h.raw_data(), h.nbytes()))));
    offset += h.nbytes();
    host.push_back(h);
  }
  for (const char* reserved : {kChecksumAlgorithmKey, kChecksumsKey})
    REMAT_CHECK(!metadata.count(reserved), IOError, "safetensors: metadata key '", reserved, "' for ", what,
                " is reserved for the checksums");
  if (!metadata.empty() || options.checksums) {
    Json meta = Json::object();
    for (const auto& [k, v] : metadata) meta.set(k, Json::string(v));
    if (options.checksums) {
      meta.set(kChecksumAlgorithmKey, Json::string(kChecksumAlgorithm));
      meta.set(kChecksumsKey, Json::string(sums.dump()));
    }
    header.set("__metadata__", meta);
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h += ' ';  // align the data section to 8 bytes
  std::string bytes;
  bytes.reserve(8 + h.size() + offset);
  const std::uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) bytes += char((n >> (8 * i)) & 0xff);
  bytes += h;
  // The data in header order: Json objects iterate keys sorted, but offsets
  // follow the input order, so append in input order.
  for (const auto& t : host) bytes.append(static_cast<const char*>(t.raw_data()), t.nbytes());
  return bytes;
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata,
                      const SafetensorsWriteOptions& options) {
  write_file_atomic(path, encode_safetensors(tensors, metadata, options, path));
}

// The format's own limit on the header (as Hugging Face's reader): a corrupt
// length cannot make a reader allocate the whole file.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

SafetensorsReader::Fd& SafetensorsReader::Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

SafetensorsReader::Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

SafetensorsReader::SafetensorsReader(std::string path) : path_(std::move(path)) {
  fd_ = Fd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
  REMAT_CHECK(fd_.get() >= 0, IOError, "cannot open ", path_, ": ", errno_text());
  parse(file_size());
}

SafetensorsReader::SafetensorsReader(std::string what, std::string_view bytes)
    : path_(std::move(what)), in_memory_(true), bytes_(bytes) {
  parse(bytes_.size());
}

SafetensorsReader SafetensorsReader::from_bytes(std::string_view bytes, std::string what) {
  return SafetensorsReader(std::move(what), bytes);
}

std::uint64_t SafetensorsReader::file_size() const {
  struct stat st {};
  REMAT_CHECK(::fstat(fd_.get(), &st) == 0, IOError, "cannot stat ", path_, ": ", errno_text());
  if (!S_ISREG(st.st_mode)) throw invalid("not a regular file");
  return std::uint64_t(st.st_size);
}

void SafetensorsReader::parse(std::uint64_t file_size) {
  const std::uint64_t data_size = read_header_into_entries(file_size);
  check_data_layout(data_size);
  read_checksums();
}

IOError SafetensorsReader::invalid(const std::string& why) const {
  return IOError(path_ + ": not a valid safetensors file: " + why);
}

std::uint64_t SafetensorsReader::read_header_into_entries(std::uint64_t file_size) {
  if (file_size < 8) throw invalid("truncated (" + std::to_string(file_size) + " bytes, no header)");
  unsigned char len[8];
  read_bytes(len, 8, 0, "the header length");
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t(len[i]) << (8 * i);
  if (n > file_size - 8) throw invalid("header length " + std::to_string(n) + " exceeds the file size " +
                                       std::to_string(file_size) + " (truncated?)");
  if (n > kMaxHeaderBytes)
    throw invalid("header length " + std::to_string(n) + " exceeds the format's limit of " +
                  std::to_string(kMaxHeaderBytes) + " bytes");
  std::string text(n, '\0');
  read_bytes(text.data(), n, 8, "the header");
  data_start_ = 8 + n;
  Json header;
  try {
    header = Json::parse(text, path_ + " header");
  } catch (const IOError& e) {
    throw invalid(e.what());
  }
  text = std::string();
  if (!header.is_object()) throw invalid("header is not a JSON object");
  const std::uint64_t data_size = file_size - data_start_;
  for (const auto& [name, entry] : header.members()) {
    try {
      if (name == "__metadata__") {
        for (const auto& [k, v] : entry.members()) metadata_[k] = v.as_string();
        continue;
      }
      entries_.emplace(name, parse_entry(name, entry, data_size));
    } catch (const IOError& e) {
      const std::string msg = e.what();
      if (msg.find("not a valid safetensors file") != std::string::npos) throw;
      throw invalid((name == "__metadata__" ? std::string("__metadata__: ") : "tensor '" + name + "': ") + msg);
    }
  }
  return data_size;
}

SafetensorsReader::Entry SafetensorsReader::parse_entry(const std::string& name, const Json& entry,
                                                        std::uint64_t data_size) const {
  DType dt;
  if (!parse_st_dtype(entry.at("dtype").as_string(), dt))
    throw invalid("tensor '" + name + "' has unsupported dtype " + entry.at("dtype").as_string());
  Shape shape;
  for (const auto& s : entry.at("shape").items()) {
    if (s.as_int() < 0) throw invalid("tensor '" + name + "' has a negative size");
    shape.push_back(s.as_int());
  }
  const auto& offs = entry.at("data_offsets").items();
  if (offs.size() != 2) throw invalid("tensor '" + name + "': data_offsets must have 2 entries");
  if (offs[0].as_int() < 0 || offs[1].as_int() < 0) throw invalid("tensor '" + name + "' has a negative offset");
  const auto b = std::uint64_t(offs[0].as_int()), e = std::uint64_t(offs[1].as_int());
  std::uint64_t want = element_size(dt);
  for (auto s : shape)
    if (__builtin_mul_overflow(want, std::uint64_t(s), &want))
      throw invalid("tensor '" + name + "' has shape " + shape_str(shape) + ", too large for any file");
  if (e < b || e > data_size)
    throw invalid("tensor '" + name + "' byte range [" + std::to_string(b) + ", " + std::to_string(e) +
                  ") is outside the data section of " + std::to_string(data_size) + " bytes (truncated?)");
  if (e - b != want)
    throw invalid("tensor '" + name + "' has " + std::to_string(e - b) + " bytes but shape " + shape_str(shape) +
                  " " + dtype_name(dt) + " needs " + std::to_string(want));
  return Entry{dt, shape, b, e, std::nullopt};
}

void SafetensorsReader::check_data_layout(std::uint64_t data_size) const {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (const auto& [name, e] : entries_) ranges.emplace_back(e.begin, e.end);
  std::sort(ranges.begin(), ranges.end());
  std::uint64_t end = 0;
  for (const auto& [b, e] : ranges) {
    if (b < end) throw invalid("tensor byte ranges overlap");
    if (b > end) throw invalid("the data section has a hole at byte " + std::to_string(end));
    end = e;
  }
  if (end != data_size)
    throw invalid("data section has " + std::to_string(data_size) + " bytes but the tensors cover " +
                  std::to_string(end));
}

void SafetensorsReader::read_checksums() {
  const auto algo = metadata_.find(kChecksumAlgorithmKey);
  const auto sums_it = metadata_.find(kChecksumsKey);
  if (algo == metadata_.end() && sums_it == metadata_.end()) return;
  if (algo == metadata_.end() || sums_it == metadata_.end())
    throw invalid(std::string("__metadata__ has '") + (algo == metadata_.end() ? kChecksumsKey : kChecksumAlgorithmKey) +
                  "' without '" + (algo == metadata_.end() ? kChecksumAlgorithmKey : kChecksumsKey) + "'");
  if (algo->second != kChecksumAlgorithm)
    throw invalid("unsupported checksum algorithm '" + algo->second + "' (this build checks " + kChecksumAlgorithm + ")");
  Json sums;
  try {
    sums = Json::parse(sums_it->second, path_ + " __metadata__.checksums");
  } catch (const IOError& e) {
    throw invalid(e.what());
  }
  if (!sums.is_object()) throw invalid("__metadata__.checksums is not a JSON object");
  for (const auto& [name, v] : sums.members())
    if (!entries_.count(name)) throw invalid("__metadata__.checksums names '" + name + "', which is not a tensor of the file");
  for (auto& [name, e] : entries_) {
    if (!sums.has(name)) throw invalid("tensor '" + name + "' has no checksum in __metadata__.checksums");
    const Json& v = sums.at(name);
    std::uint64_t stored = 0;
    if (!v.is_string() || !parse_hex64(v.as_string(), stored))
      throw invalid("the checksum of tensor '" + name + "' is not 16 lowercase hex digits");
    e.checksum = stored;
  }
  metadata_.erase(kChecksumAlgorithmKey);
  metadata_.erase(kChecksumsKey);
  checksummed_ = true;
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

const SafetensorsReader::Entry& SafetensorsReader::entry(const std::string& name) const {
  const auto it = entries_.find(name);
  REMAT_CHECK(it != entries_.end(), IOError, path_, ": no tensor '", name, "' in the file");
  return it->second;
}

DType SafetensorsReader::dtype(const std::string& name) const { return entry(name).dtype; }
const Shape& SafetensorsReader::shape(const std::string& name) const { return entry(name).shape; }
std::size_t SafetensorsReader::nbytes(const std::string& name) const {
  const Entry& e = entry(name);
  return std::size_t(e.end - e.begin);
}

void SafetensorsReader::read_bytes(void* dst, std::uint64_t n, std::uint64_t at, const std::string& what) const {
  auto* p = static_cast<char*>(dst);
  if (in_memory_) {
    if (at > bytes_.size() || n > bytes_.size() - at)
      throw IOError(path_ + ": unexpected end of the data at byte " + std::to_string(bytes_.size()) + " reading " +
                    what);
    if (n > 0) std::memcpy(p, bytes_.data() + at, std::size_t(n));
    return;
  }
  std::uint64_t done = 0;
  while (done < n) {
    // Linux moves at most 0x7ffff000 bytes a call; ask for 1 GiB at a time.
    const std::size_t ask = std::size_t(std::min<std::uint64_t>(n - done, std::uint64_t(1) << 30));
    const ssize_t k = ::pread(fd_.get(), p + done, ask, off_t(at + done));
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) throw IOError("reading " + what + " of " + path_ + " failed: " + errno_text());
    if (k == 0)
      throw IOError(path_ + ": unexpected end of file at byte " + std::to_string(at + done) + " reading " + what +
                    " (the file shrank after it was opened?)");
    done += std::uint64_t(k);
  }
}

Tensor SafetensorsReader::read(const std::string& name, std::optional<DType> as) const {
  const Entry& e = entry(name);
  const DType want = as.value_or(e.dtype);
  if (want != e.dtype)
    REMAT_CHECK(is_floating(want) && is_floating(e.dtype), DTypeError, path_, ": tensor '", name, "' is ",
                dtype_name(e.dtype), " and cannot be read as ", dtype_name(want),
                " (conversions are between f32, bf16 and f16)");
  const bool direct = want == e.dtype || (want == DType::f32 && (e.dtype == DType::bf16 || e.dtype == DType::f16));
  Tensor t = empty(e.shape, direct ? want : e.dtype);
  read_into(name, t);
  return direct ? t : t.to(want);
}

namespace {
// `count` bf16 / f16 values at `raw` (the back half of `out`'s bytes, or
// anywhere) widened to f32 in `out`, front to back (element i's 4 bytes end
// before stored element i+1 begins, so the back half is read before written).
void widen_in_place(DType stored, const char* raw, float* out, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    std::uint16_t h;
    std::memcpy(&h, raw + 2 * i, 2);
    const float f = stored == DType::bf16 ? std::bit_cast<float>(std::uint32_t(h) << 16) : f16::to_float(h);
    std::memcpy(out + i, &f, 4);
  }
}
}  // namespace

void SafetensorsReader::read_into(const std::string& name, Tensor& dst) const {
  const Entry& e = entry(name);
  const bool widen = dst.dtype() == DType::f32 && (e.dtype == DType::bf16 || e.dtype == DType::f16);
  REMAT_CHECK(dst.device().is_cpu() && dst.is_contiguous() && dst.sizes() == e.shape &&
                  (dst.dtype() == e.dtype || widen),
              DTypeError, path_, ": tensor '", name, "' (", dtype_name(e.dtype), " ", shape_str(e.shape),
              ") cannot be read into a ", dst.is_contiguous() ? "" : "non-contiguous ", dtype_name(dst.dtype()), " ",
              shape_str(dst.sizes()), " ", dst.device().str(),
              " tensor (needs a contiguous CPU tensor of its shape, its dtype or f32)");
  const std::uint64_t n = e.end - e.begin;
  // Widening: the stored bytes go to the back half of the f32 tensor and
  // widen front to back in place (element i's 4 bytes end before stored
  // element i+1 begins), so nothing is copied twice.
  char* raw = n == 0 ? nullptr : static_cast<char*>(dst.raw_data()) + (widen ? n : 0);
  if (n > 0) read_bytes(raw, n, data_start_ + e.begin, "tensor '" + name + "'");
  if (e.checksum) {
    const std::uint64_t got = xxh3_64(raw, n);
    if (got != *e.checksum) throw checksum_mismatch(name, got, *e.checksum);
  }
  if (widen) widen_in_place(e.dtype, raw, static_cast<float*>(dst.raw_data()), std::size_t(n / 2));
}

IOError SafetensorsReader::checksum_mismatch(const std::string& name, std::uint64_t got, std::uint64_t want) const {
  return IOError(path_ + ": checksum mismatch in tensor '" + name + "': its data hashes to " + hex64(got) +
                 " but the file records " + hex64(want) + " (" + kChecksumAlgorithm + "); the file is corrupt");
}

void SafetensorsReader::verify(const std::string& name) const {
  const Entry& e = entry(name);
  if (!e.checksum) return;
  {
    const std::lock_guard<std::mutex> lock(verified_->mu);
    if (verified_->names.count(name)) return;
  }
  const std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(XXH3_createState(), XXH3_freeState);
  REMAT_CHECK(state && XXH3_64bits_reset(state.get()) == XXH_OK, Error, "verifying tensor '", name, "' of ", path_,
              ": cannot start a hash (out of memory)");
  constexpr std::uint64_t kChunk = std::uint64_t(8) << 20;
  std::vector<char> buf(std::size_t(std::min(kChunk, e.end - e.begin)));
  for (std::uint64_t at = e.begin; at < e.end; at += kChunk) {
    const std::uint64_t n = std::min(kChunk, e.end - at);
    read_bytes(buf.data(), n, data_start_ + at, "tensor '" + name + "'");
    XXH3_64bits_update(state.get(), buf.data(), std::size_t(n));
  }
  const std::uint64_t got = XXH3_64bits_digest(state.get());
  if (got != *e.checksum) throw checksum_mismatch(name, got, *e.checksum);
  const std::lock_guard<std::mutex> lock(verified_->mu);
  verified_->names.insert(name);
}

void SafetensorsReader::read_range_into(const std::string& name, std::int64_t begin, Tensor& dst) const {
  const Entry& e = entry(name);
  const bool widen = dst.dtype() == DType::f32 && (e.dtype == DType::bf16 || e.dtype == DType::f16);
  const std::int64_t n = dst.numel(), total = shape_numel(e.shape);
  REMAT_CHECK(dst.device().is_cpu() && dst.is_contiguous() && (dst.dtype() == e.dtype || widen) && begin >= 0 &&
                  begin + n <= total,
              DTypeError, path_, ": elements [", begin, ", ", begin + n, ") of tensor '", name, "' (",
              dtype_name(e.dtype), " ", shape_str(e.shape), ") cannot be read into a ",
              dst.is_contiguous() ? "" : "non-contiguous ", dtype_name(dst.dtype()), " ", shape_str(dst.sizes()), " ",
              dst.device().str(), " tensor (needs a range inside it and a contiguous CPU tensor of its dtype or f32)");
  const std::uint64_t es = element_size(e.dtype), bytes = std::uint64_t(n) * es;
  char* raw = bytes == 0 ? nullptr : static_cast<char*>(dst.raw_data()) + (widen ? bytes : 0);
  if (bytes > 0) read_bytes(raw, bytes, data_start_ + e.begin + std::uint64_t(begin) * es, "tensor '" + name + "'");
  if (widen) widen_in_place(e.dtype, raw, static_cast<float*>(dst.raw_data()), std::size_t(n));
}

namespace {

// Every tensor of `reader`, its metadata and whether it carried checksums.
SafetensorsFile read_whole(const SafetensorsReader& reader) {
  SafetensorsFile out;
  for (const auto& name : reader.names()) out.tensors.emplace(name, reader.read(name));
  out.metadata = reader.metadata();
  out.checksummed = reader.checksummed();
  return out;
}

}  // namespace

SafetensorsFile load_safetensors(const std::string& path) { return read_whole(SafetensorsReader(path)); }

SafetensorsFile decode_safetensors(std::string_view bytes, const std::string& what) {
  return read_whole(SafetensorsReader::from_bytes(bytes, what));
}

}  // namespace remat
