#include "train/hf_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>

#include "engine/json.h"
#include "train/file_io.h"

namespace remat {

namespace {

namespace fs = std::filesystem;

std::mutex g_export_hook_mutex;
ExportFaultHook g_export_hook;  // guarded by g_export_hook_mutex

using file_io::errno_text;
using file_io::Fd;
using file_io::write_all;

std::string join(const std::string& dir, const std::string& name) {
  return !dir.empty() && dir.back() == '/' ? dir + name : dir + "/" + name;
}

// True when `path` exists (as anything); false for ENOENT; IOError otherwise.
bool exists(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return true;
  if (errno == ENOENT || errno == ENOTDIR) return false;
  throw IOError("cannot stat " + path + ": " + errno_text());
}





// `t` as a contiguous CPU tensor in `dtype` (floating tensors) or its own
// dtype (others).
Tensor host_in(const Tensor& t, DType dtype) {
  Tensor h = t.detach();
  if (!h.device().is_cpu()) h = h.to(kCPU);
  if (is_floating(h.dtype()) && h.dtype() != dtype) h = h.to(dtype);
  return h.contiguous();
}

struct Planned {
  const HfTensorSource* source;
  DType dtype;  // as written
  std::uint64_t bytes;
};

// Streams one safetensors file holding `items` (converted one at a time) to
// a temporary file next to `path`, fsyncs it, renames it over `path` and
// fsyncs the folder. On failure the temporary file is removed.
void write_shard(const std::string& dir, const std::string& path, const std::vector<Planned>& items) {
  Json header = Json::object();
  std::uint64_t offset = 0;
  for (const auto& it : items) {
    Json shape = Json::array();
    for (auto s : it.source->shape) shape.push(Json::number(double(s)));
    Json entry = Json::object();
    entry.set("dtype", Json::string(safetensors_dtype(it.dtype)));
    entry.set("shape", shape);
    entry.set("data_offsets",
              Json::array({Json::number(double(offset)), Json::number(double(offset + it.bytes))}));
    header.set(it.source->name, entry);
    offset += it.bytes;
  }
  Json meta = Json::object();
  meta.set("format", Json::string("pt"));
  header.set("__metadata__", meta);
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h += ' ';  // align the data section to 8 bytes
  std::string head;
  const std::uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) head += char((n >> (8 * i)) & 0xff);
  head += h;

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  REMAT_CHECK(fd.fd >= 0, IOError, "cannot create ", tmp, ": ", errno_text());
  try {
    auto check = [&](bool ok, const char* what) {
      if (!ok) throw IOError(std::string(what) + " " + tmp + " failed: " + errno_text());
    };
    check(write_all(fd.fd, head.data(), head.size()), "writing");
    for (const auto& it : items) {
      const Tensor t = host_in(it.source->read(), it.dtype);
      REMAT_CHECK(t.nbytes() == it.bytes, IOError, "tensor '", it.source->name, "' read as ", t.nbytes(),
                  " bytes while ", path, " was written; its plan had ", it.bytes);
      check(write_all(fd.fd, static_cast<const char*>(t.raw_data()), t.nbytes()), "writing");
    }
    check(::fsync(fd.fd) == 0, "fsync of");
    const int fdv = std::exchange(fd.fd, -1);
    check(::close(fdv) == 0, "closing");
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      throw IOError("cannot rename " + tmp + " to " + path + ": " + errno_text());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_dir(dir);
}

// Removes `path` if it exists; true when it did.
bool remove_if_present(const std::string& path) {
  if (::unlink(path.c_str()) == 0) return true;
  if (errno == ENOENT) return false;
  throw IOError("cannot remove " + path + ": " + errno_text());
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// "model-DDDDD-of-DDDDD.safetensors".
bool is_shard_name(std::string_view f) {
  constexpr std::string_view head = "model-", mid = "-of-", tail = ".safetensors";
  return f.size() == head.size() + 5 + mid.size() + 5 + tail.size() && f.substr(0, head.size()) == head &&
         all_digits(f.substr(head.size(), 5)) && f.substr(head.size() + 5, mid.size()) == mid &&
         all_digits(f.substr(head.size() + 5 + mid.size(), 5)) && f.substr(f.size() - tail.size()) == tail;
}

// A temporary file of an export: "NAME.tmp.PID" for NAME a shard, the
// single file or the index.
bool is_export_tmp(std::string_view f) {
  const auto at = f.rfind(".tmp.");
  if (at == std::string_view::npos || !all_digits(f.substr(at + 5))) return false;
  const std::string_view name = f.substr(0, at);
  return name == kHfSingleFile || name == kHfIndexFile || is_shard_name(name);
}

}  // namespace

std::string hf_shard_name(int index, int count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", index, count);
  return buf;
}

// ---- reading ---------------------------------------------------------------

HfIndex parse_hf_index(const std::string& text, const std::string& what) {
  auto fail = [&](const std::string& why) { return IOError(what + ": " + why); };
  const Json j = Json::parse(text, what);
  if (!j.is_object()) throw fail("not a JSON object");
  HfIndex out;
  if (j.has("metadata")) {
    const Json& m = j.at("metadata");
    if (!m.is_object()) throw fail("\"metadata\" is not a JSON object");
    if (m.has("total_size")) {
      const Json& ts = m.at("total_size");
      if (!ts.is_number() || ts.as_number() < 0) throw fail("metadata.total_size is not a non-negative integer");
      try {
        out.total_size = ts.as_int();
      } catch (const IOError&) {
        throw fail("metadata.total_size is not a non-negative integer");
      }
    }
  }
  if (!j.has("weight_map")) throw fail("no \"weight_map\"");
  const Json& wm = j.at("weight_map");
  if (!wm.is_object()) throw fail("\"weight_map\" is not a JSON object");
  for (const auto& [tensor, file] : wm.members()) {
    if (!file.is_string()) throw fail("weight_map entry of tensor '" + tensor + "' is not a string");
    const std::string& f = file.as_string();
    if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos || f.find('\0') != std::string::npos)
      throw fail("weight_map maps tensor '" + tensor + "' to '" + f + "', which is not a file name in the folder");
    out.weight_map.emplace(tensor, f);
  }
  return out;
}

CheckpointFiles::CheckpointFiles(std::string dir) : dir_(std::move(dir)) {
  const std::string single = join(dir_, kHfSingleFile), index = join(dir_, kHfIndexFile);
  if (exists(single)) {
    files_.push_back(kHfSingleFile);
    readers_.emplace_back(single);
    for (const auto& name : readers_.back().names()) where_.emplace(name, 0);
    return;
  }
  if (!exists(index))
    throw IOError(dir_ + ": not a Hugging Face checkpoint folder: it has neither " + kHfSingleFile + " nor " +
                  kHfIndexFile);
  sharded_ = true;
  auto fail = [&](const std::string& why) { return IOError(index + ": " + why); };
  const HfIndex parsed = parse_hf_index(file_io::read_file(index), index);
  const std::map<std::string, std::string>& mapped = parsed.weight_map;
  std::map<std::string, std::string> first_tensor;  // file -> a tensor mapped to it (for messages)
  for (const auto& [tensor, f] : mapped) first_tensor.emplace(f, tensor);
  std::map<std::string, std::size_t> file_index;
  for (const auto& [f, tensor] : first_tensor) {
    const std::string path = join(dir_, f);
    if (!exists(path))
      throw fail("weight_map maps tensor '" + tensor + "' to " + f + ", which does not exist in " + dir_);
    file_index.emplace(f, files_.size());
    files_.push_back(f);
    readers_.emplace_back(path);  // validates the header, or throws naming the file
  }
  for (const auto& [tensor, f] : mapped) {
    const std::size_t i = file_index.at(f);
    if (!readers_[i].has(tensor))
      throw fail("weight_map maps tensor '" + tensor + "' to " + f + ", which does not hold it");
    where_.emplace(tensor, i);
  }
  for (std::size_t i = 0; i < files_.size(); ++i)
    for (const auto& tensor : readers_[i].names()) {
      const auto it = mapped.find(tensor);
      if (it == mapped.end())
        throw fail(files_[i] + " holds tensor '" + tensor + "', which weight_map does not list");
      if (it->second != files_[i])
        throw fail("tensor '" + tensor + "' is in both " + files_[i] + " and " + it->second +
                   " (weight_map maps it to " + it->second + ")");
    }
}

std::vector<std::string> CheckpointFiles::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, i] : where_) out.push_back(name);
  return out;
}

const SafetensorsReader& CheckpointFiles::reader_of(const std::string& name) const {
  const auto it = where_.find(name);
  REMAT_CHECK(it != where_.end(), IOError, dir_, ": the checkpoint has no tensor '", name, "'");
  return readers_[it->second];
}

const std::string& CheckpointFiles::file_of(const std::string& name) const {
  reader_of(name);
  return files_[where_.at(name)];
}

const Shape& CheckpointFiles::shape(const std::string& name) const { return reader_of(name).shape(name); }
DType CheckpointFiles::dtype(const std::string& name) const { return reader_of(name).dtype(name); }
std::size_t CheckpointFiles::nbytes(const std::string& name) const { return reader_of(name).nbytes(name); }

std::uint64_t CheckpointFiles::total_bytes() const {
  std::uint64_t sum = 0;
  for (const auto& [name, i] : where_) sum += readers_[i].nbytes(name);
  return sum;
}

Tensor CheckpointFiles::read(const std::string& name, std::optional<DType> as) const {
  return reader_of(name).read(name, as);
}

void CheckpointFiles::read_into(const std::string& name, Tensor& dst) const { reader_of(name).read_into(name, dst); }
void CheckpointFiles::read_range_into(const std::string& name, std::int64_t begin, Tensor& dst) const {
  reader_of(name).read_range_into(name, begin, dst);
}

// ---- writing ---------------------------------------------------------------

void set_export_fault_hook(ExportFaultHook hook) {
  std::lock_guard<std::mutex> lock(g_export_hook_mutex);
  g_export_hook = std::move(hook);
}

void export_fault_point(ExportStep step) {
  ExportFaultHook hook;
  {
    std::lock_guard<std::mutex> lock(g_export_hook_mutex);
    hook = g_export_hook;
  }
  if (hook) hook(step);
}

void save_hf_checkpoint(const std::string& dir, const std::vector<std::pair<std::string, Tensor>>& tensors,
                        DType dtype, std::int64_t max_shard_bytes) {
  save_hf_checkpoint(dir, hf_sources(tensors), dtype, max_shard_bytes);
}

std::vector<HfTensorSource> hf_sources(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::vector<HfTensorSource> out;
  for (const auto& [name, t] : tensors) {
    REMAT_CHECK(t.defined(), IOError, "save_hf_checkpoint: tensor '", name, "' is undefined");
    const Tensor held = t;  // (a lambda may not capture a structured binding before C++20's clang 16)
    out.push_back({name, t.sizes(), t.dtype(), [held] { return held; }});
  }
  return out;
}

void save_hf_checkpoint(const std::string& dir, const std::vector<HfTensorSource>& tensors, DType dtype,
                        std::int64_t max_shard_bytes) {
  REMAT_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16, DTypeError,
              "save_hf_checkpoint: dtype must be f32, bf16 or f16, got ", dtype_name(dtype));
  REMAT_CHECK(max_shard_bytes > 0, IOError, "save_hf_checkpoint: max_shard_bytes must be positive, got ",
              max_shard_bytes);
  // 1. The plan: every tensor's bytes as written, and the shards.
  std::set<std::string> seen;
  std::vector<std::vector<Planned>> shards;
  std::uint64_t shard_bytes = 0, total = 0;
  for (const HfTensorSource& src : tensors) {
    const std::string& name = src.name;
    REMAT_CHECK(!name.empty() && name != "__metadata__", IOError, "save_hf_checkpoint: invalid tensor name '",
                name, "' for ", dir);
    REMAT_CHECK(seen.insert(name).second, IOError, "save_hf_checkpoint: duplicate tensor name '", name, "' for ",
                dir);
    REMAT_CHECK(src.read != nullptr, IOError, "save_hf_checkpoint: tensor '", name, "' for ", dir, " has no reader");
    const DType out = is_floating(src.dtype) ? dtype : src.dtype;
    const std::uint64_t bytes = std::uint64_t(shape_numel(src.shape)) * element_size(out);
    if (shards.empty() || (!shards.back().empty() && shard_bytes + bytes > std::uint64_t(max_shard_bytes))) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(Planned{&src, out, bytes});
    shard_bytes += bytes;
    total += bytes;
  }
  if (shards.empty()) shards.emplace_back();  // no tensors: one empty model.safetensors
  const bool sharded = shards.size() > 1;
  REMAT_CHECK(shards.size() <= 99999, IOError, "save_hf_checkpoint: ", shards.size(),
              " shards for ", dir, " (at most 99999 fit the file names); raise max_shard_bytes");

  // 2. The folder, without the old entry points: from here until the new
  // index is written, nothing reads as a checkpoint, never as a mixed one.
  std::error_code ec;
  fs::create_directories(dir, ec);
  REMAT_CHECK(!ec, IOError, "cannot create the folder ", dir, ": ", ec.message());
  bool removed = remove_if_present(join(dir, kHfIndexFile));
  if (sharded) removed = remove_if_present(join(dir, kHfSingleFile)) || removed;
  if (removed) fsync_dir(dir);

  // 3. The data files, one at a time, then the index.
  std::set<std::string> written;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const std::string file = sharded ? hf_shard_name(int(s + 1), int(shards.size())) : kHfSingleFile;
    write_shard(dir, join(dir, file), shards[s]);
    written.insert(file);
    export_fault_point(ExportStep::shard);
  }
  if (sharded) {
    Json wm = Json::object();
    for (std::size_t s = 0; s < shards.size(); ++s)
      for (const auto& it : shards[s]) wm.set(it.source->name, Json::string(hf_shard_name(int(s + 1), int(shards.size()))));
    Json meta = Json::object();
    meta.set("total_size", Json::number(double(total)));
    Json index = Json::object();
    index.set("metadata", meta);
    index.set("weight_map", wm);
    write_file_atomic(join(dir, kHfIndexFile), index.dump() + "\n");
  }

  // 4. What earlier exports left: their shards and temporary files.
  std::vector<std::string> doomed;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string f = it->path().filename().string();
    if (!written.count(f) && (is_shard_name(f) || is_export_tmp(f))) doomed.push_back(f);
  }
  REMAT_CHECK(!ec, IOError, "cannot list the folder ", dir, ": ", ec.message());
  for (const auto& f : doomed) remove_if_present(join(dir, f));
  if (!doomed.empty()) fsync_dir(dir);
  export_fault_point(ExportStep::weights);
}

}  // namespace remat
