#include "train/sharded_state.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <map>
#include <set>

#include "engine/grad_mode.h"
#include "engine/json.h"
#include "train/file_io.h"
#include "train/state_files.h"

namespace remat {

namespace {
std::string rank_file(const std::string& dir, const std::string& folder, int rank) {
  return dir + "/" + folder + "/rank-" + std::to_string(rank) + ".safetensors";
}

// The shard folder a state file names (empty for an unsharded state or a
// file that cannot be read).
std::string referenced_folder(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return "";
  try {
    const SafetensorsReader r(path);
    auto it = r.metadata().find(kShardIndexKey);
    if (it == r.metadata().end()) return "";
    return Json::parse(it->second, path).at("folder").as_string();
  } catch (const std::exception&) {
    return "";
  }
}
}  // namespace

std::string shard_folder_name(const std::string& dir, std::int64_t step) {
  const std::set<std::string> taken = {referenced_folder(state_file(dir)), referenced_folder(prev_state_file(dir))};
  std::string name = "shards-" + std::to_string(step);
  for (int k = 1; taken.count(name); ++k) name = "shards-" + std::to_string(step) + "-" + std::to_string(k);
  return name;
}

void write_rank_shards(const std::string& dir, const std::string& folder, int rank, int ranks, std::int64_t step,
                       const std::vector<std::pair<std::string, Tensor>>& pieces) {
  const std::string sub = dir + "/" + folder;
  std::error_code ec;
  std::filesystem::create_directories(sub, ec);
  REMAT_CHECK(!ec, IOError, "sharded save: cannot create ", sub, ": ", ec.message());
  std::vector<std::pair<std::string, Tensor>> contiguous;
  for (const auto& [name, t] : pieces) contiguous.emplace_back(name, t.contiguous());
  save_safetensors(rank_file(dir, folder, rank), contiguous,
                   {{"step", std::to_string(step)}, {"rank", std::to_string(rank)}, {"ranks", std::to_string(ranks)}});
}

std::string shard_index(const std::string& folder, int ranks, std::int64_t step,
                        const std::vector<std::pair<std::string, Shape>>& tensors) {
  Json shapes = Json::object();
  for (const auto& [name, shape] : tensors) {
    Json dims = Json::array();
    for (std::int64_t d : shape) dims.push(Json::number(double(d)));
    shapes.set(name, dims);
  }
  Json j = Json::object();
  j.set("folder", Json::string(folder));
  j.set("ranks", Json::number(ranks));
  j.set("step", Json::number(double(step)));
  j.set("tensors", shapes);
  return j.dump();
}

std::optional<ShardedSetReader> ShardedSetReader::open(const std::string& dir,
                                                      const std::map<std::string, std::string>& state_metadata) {
  auto it = state_metadata.find(kShardIndexKey);
  if (it == state_metadata.end()) return std::nullopt;
  ShardedSetReader r;
  r.dir_ = dir;
  const Json index = Json::parse(it->second, "the shard index of " + dir);
  const std::string folder = index.at("folder").as_string();
  const std::int64_t ranks = index.at("ranks").as_int(), step = index.at("step").as_int();
  REMAT_CHECK(folder.find('/') == std::string::npos && ranks >= 1, IOError, "sharded state in ", dir,
              ": the index names folder '", folder, "' over ", ranks, " rank(s)");
  r.folder_ = folder;
  for (const auto& [name, dims] : index.at("tensors").members()) {
    Shape shape;
    for (const Json& d : dims.items()) shape.push_back(d.as_int());
    r.tensors_[name].shape = shape;
  }
  for (int rank = 0; rank < int(ranks); ++rank) r.open_rank_file(rank, ranks, step);
  for (const auto& [name, t] : r.tensors_) {
    std::int64_t covered = 0;
    for (const Piece& p : t.pieces) covered += p.n;
    REMAT_CHECK(covered == shape_numel(t.shape), IOError, "sharded state in ", dir, ": the pieces of '", name,
                "' in ", folder, " cover ", covered, " of its ", shape_numel(t.shape), " elements");
  }
  return r;
}

// Rank `rank`'s file: its header checked against the index (step, rank,
// ranks; every piece a range of a tensor it names); no data read.
void ShardedSetReader::open_rank_file(int rank, std::int64_t ranks, std::int64_t step) {
  const std::string path = rank_file(dir_, folder_, rank);
  struct stat st;
  REMAT_CHECK(::stat(path.c_str(), &st) == 0, IOError, "sharded state in ", dir_, ": rank file ", path,
              " of the set of ", ranks, " rank(s) is missing");
  files_.push_back(std::make_unique<SafetensorsReader>(path));
  const SafetensorsReader& f = *files_.back();
  auto meta = [&](const char* key) {
    auto m = f.metadata().find(key);
    return m == f.metadata().end() ? std::string("?") : m->second;
  };
  REMAT_CHECK(meta("step") == std::to_string(step) && meta("rank") == std::to_string(rank) &&
                  meta("ranks") == std::to_string(ranks),
              IOError, "sharded state in ", dir_, ": ", path, " holds step ", meta("step"), ", rank ", meta("rank"),
              " of ", meta("ranks"), "; the index expects step ", step, ", rank ", rank, " of ", ranks);
  for (const std::string& piece : f.names()) {
    const std::size_t at = piece.rfind('@');
    const std::string name = at == std::string::npos ? piece : piece.substr(0, at);
    auto w = tensors_.find(name);
    REMAT_CHECK(at != std::string::npos && w != tensors_.end() && f.shape(piece).size() == 1 &&
                    f.dtype(piece) == DType::f32,
                IOError, "sharded state in ", dir_, ": ", path, " holds '", piece,
                "', which is no piece of a tensor the index names");
    const std::int64_t begin = std::stoll(piece.substr(at + 1)), n = f.shape(piece)[0];
    REMAT_CHECK(begin >= 0 && begin + n <= shape_numel(w->second.shape), IOError, "sharded state in ", dir_,
                ": piece '", piece, "' of ", path, " (", n, " elements) lies outside '", name, "' of ",
                shape_numel(w->second.shape));
    w->second.pieces.push_back({files_.size() - 1, piece, begin, n});
  }
}

std::vector<std::string> ShardedSetReader::names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : tensors_) out.push_back(name);
  return out;
}

const Shape& ShardedSetReader::shape(const std::string& name) const {
  auto it = tensors_.find(name);
  REMAT_CHECK(it != tensors_.end(), IOError, "sharded state in ", dir_, ": no sharded tensor '", name, "'");
  return it->second.shape;
}

Tensor ShardedSetReader::read(const std::string& name) const {
  NoGradGuard ng;
  Tensor whole = empty(shape(name));  // (CPU, f32; every element written below: the pieces cover it)
  Tensor flat = whole.view({-1});
  read_range(name, 0, flat);
  return whole;
}

void ShardedSetReader::read_range(const std::string& name, std::int64_t begin, Tensor& dst) const {
  const std::int64_t total = shape_numel(shape(name)), n = dst.numel(), end = begin + n;
  REMAT_CHECK(dst.device().is_cpu() && dst.is_contiguous() && dst.dtype() == DType::f32 && begin >= 0 && end <= total,
              DTypeError, "sharded state in ", dir_, ": elements [", begin, ", ", end, ") of '", name, "' (",
              total, " elements) cannot be read into a ", dst.is_contiguous() ? "" : "non-contiguous ",
              dtype_name(dst.dtype()), " ", shape_str(dst.sizes()), " ", dst.device().str(),
              " tensor (needs a range inside it and a contiguous f32 CPU tensor)");
  NoGradGuard ng;
  Tensor flat = dst.view({-1});
  for (const Piece& p : tensors_.at(name).pieces) {
    const std::int64_t from = std::max(begin, p.begin), to = std::min(end, p.begin + p.n);
    if (from >= to) continue;
    Tensor part = flat.narrow(0, from - begin, to - from);
    const SafetensorsReader& file = *files_[p.file];
    if (to - from == p.n) {
      file.read_into(p.piece, part);  // (its checksum verified)
    } else {
      file.verify(p.piece);
      file.read_range_into(p.piece, from - p.begin, part);
    }
  }
}

void ShardedSetReader::verify_range(const std::string& name, std::int64_t begin, std::int64_t n) const {
  shape(name);  // (IOError for a name the set does not hold)
  for (const Piece& p : tensors_.at(name).pieces)
    if (std::max(begin, p.begin) < std::min(begin + n, p.begin + p.n)) files_[p.file]->verify(p.piece);
}

void complete_sharded_state(const std::string& dir, SafetensorsFile& file) {
  const std::optional<ShardedSetReader> set = ShardedSetReader::open(dir, file.metadata);
  if (!set) return;
  for (const std::string& name : set->names()) {
    REMAT_CHECK(!file.tensors.count(name), IOError, "sharded state in ", dir, ": '", name,
                "' is both whole in the index and in shards");
    file.tensors[name] = set->read(name);
  }
}

void remove_unreferenced_shards(const std::string& dir) {
  std::set<std::string> keep = {referenced_folder(state_file(dir)), referenced_folder(prev_state_file(dir))};
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("shards-", 0) == 0 && e.is_directory() && !keep.count(name)) std::filesystem::remove_all(e.path(), ec);
  }
}

}  // namespace remat
