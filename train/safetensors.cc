#include "train/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "engine/json.h"

namespace remat {

namespace {

const char* st_dtype(DType t) {
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

bool parse_st_dtype(const std::string& s, DType& out) {
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64, DType::boolean,
                  DType::fp8_e4m3})
    if (s == st_dtype(t)) {
      out = t;
      return true;
    }
  return false;
}

std::string errno_text() { return std::strerror(errno); }

std::string dir_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REMAT_CHECK(fd >= 0, IOError, "cannot create ", tmp, ": ", errno_text());
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string err = errno_text();
      ::close(fd);
      ::unlink(tmp.c_str());
      throw IOError("cannot write " + tmp + ": " + err);
    }
    done += std::size_t(n);
  }
  if (::fsync(fd) != 0) {
    const std::string err = errno_text();
    ::close(fd);
    ::unlink(tmp.c_str());
    throw IOError("fsync of " + tmp + " failed: " + err);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = errno_text();
    ::unlink(tmp.c_str());
    throw IOError("cannot rename " + tmp + " to " + path + ": " + err);
  }
  // Make the rename itself durable.
  const int dfd = ::open(dir_of(path).c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  std::set<std::string> names;
  std::vector<Tensor> host;
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    REMAT_CHECK(!name.empty() && name != "__metadata__", IOError, "safetensors: invalid tensor name '",
                name, "' for ", path);
    REMAT_CHECK(names.insert(name).second, IOError, "safetensors: duplicate tensor name '", name,
                "' for ", path);
    REMAT_CHECK(t.defined(), IOError, "safetensors: tensor '", name, "' is undefined");
    Tensor h = t.detach().to(kCPU).contiguous();
    Json shape = Json::array();
    for (auto s : h.sizes()) shape.push(Json::number(double(s)));
    Json entry = Json::object();
    entry.set("dtype", Json::string(st_dtype(h.dtype())));
    entry.set("shape", shape);
    entry.set("data_offsets", Json::array({Json::number(double(offset)),
                                           Json::number(double(offset + h.nbytes()))}));
    header.set(name, entry);
    offset += h.nbytes();
    host.push_back(h);
  }
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [k, v] : metadata) meta.set(k, Json::string(v));
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
  write_file_atomic(path, bytes);
}

SafetensorsFile load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REMAT_CHECK(in.good(), IOError, "cannot open ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string file = ss.str();
  auto fail = [&](const std::string& why) -> IOError { return IOError(path + ": not a valid safetensors file: " + why); };
  if (file.size() < 8) throw fail("truncated (" + std::to_string(file.size()) + " bytes, no header)");
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t(static_cast<unsigned char>(file[std::size_t(i)])) << (8 * i);
  if (n > file.size() - 8) throw fail("header length " + std::to_string(n) + " exceeds the file size " +
                                      std::to_string(file.size()) + " (truncated?)");
  Json header;
  try {
    header = Json::parse(file.substr(8, n), path + " header");
  } catch (const IOError& e) {
    throw fail(e.what());
  }
  if (!header.is_object()) throw fail("header is not a JSON object");
  const std::uint64_t data_size = file.size() - 8 - n;
  const char* data = file.data() + 8 + n;

  SafetensorsFile out;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (const auto& [name, entry] : header.members()) {
    try {
      if (name == "__metadata__") {
        for (const auto& [k, v] : entry.members()) out.metadata[k] = v.as_string();
        continue;
      }
      DType dt;
      if (!parse_st_dtype(entry.at("dtype").as_string(), dt))
        throw fail("tensor '" + name + "' has unsupported dtype " + entry.at("dtype").as_string());
      Shape shape;
      for (const auto& s : entry.at("shape").items()) {
        if (s.as_int() < 0) throw fail("tensor '" + name + "' has a negative size");
        shape.push_back(s.as_int());
      }
      const auto& offs = entry.at("data_offsets").items();
      if (offs.size() != 2) throw fail("tensor '" + name + "': data_offsets must have 2 entries");
      const auto b = std::uint64_t(offs[0].as_int()), e = std::uint64_t(offs[1].as_int());
      const std::uint64_t want = std::uint64_t(shape_numel(shape)) * element_size(dt);
      if (e < b || e > data_size)
        throw fail("tensor '" + name + "' byte range [" + std::to_string(b) + ", " + std::to_string(e) +
                   ") is outside the data section of " + std::to_string(data_size) + " bytes (truncated?)");
      if (e - b != want)
        throw fail("tensor '" + name + "' has " + std::to_string(e - b) + " bytes but shape " +
                   shape_str(shape) + " " + dtype_name(dt) + " needs " + std::to_string(want));
      ranges.emplace_back(b, e);
      Tensor t = empty(shape, dt);
      if (want) std::memcpy(t.raw_data(), data + b, want);
      out.tensors.emplace(name, t);
    } catch (const IOError& e) {
      const std::string msg = e.what();
      if (msg.find("not a valid safetensors file") != std::string::npos) throw;
      throw fail("tensor '" + name + "': " + msg);
    }
  }
  std::sort(ranges.begin(), ranges.end());
  std::uint64_t end = 0;
  for (const auto& [b, e] : ranges) {
    if (b < end) throw fail("tensor byte ranges overlap");
    if (b > end) throw fail("the data section has a hole at byte " + std::to_string(end));
    end = e;
  }
  if (end != data_size)
    throw fail("data section has " + std::to_string(data_size) + " bytes but the tensors cover " +
               std::to_string(end));
  return out;
}

}  // namespace remat
