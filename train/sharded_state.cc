#include "train/sharded_state.h"

#include <sys/stat.h>

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

void complete_sharded_state(const std::string& dir, SafetensorsFile& file) {
  auto it = file.metadata.find(kShardIndexKey);
  if (it == file.metadata.end()) return;
  const Json index = Json::parse(it->second, "the shard index of " + dir);
  const std::string folder = index.at("folder").as_string();
  const std::int64_t ranks = index.at("ranks").as_int(), step = index.at("step").as_int();
  REMAT_CHECK(folder.find('/') == std::string::npos && ranks >= 1, IOError, "sharded state in ", dir,
              ": the index names folder '", folder, "' over ", ranks, " rank(s)");
  std::map<std::string, Tensor> whole;
  std::map<std::string, std::int64_t> covered;
  for (const auto& [name, dims] : index.at("tensors").members()) {
    Shape shape;
    for (const Json& d : dims.items()) shape.push_back(d.as_int());
    whole[name] = zeros(shape);
    covered[name] = 0;
  }
  NoGradGuard ng;
  for (int r = 0; r < int(ranks); ++r) {
    const std::string path = rank_file(dir, folder, r);
    struct stat st;
    REMAT_CHECK(::stat(path.c_str(), &st) == 0, IOError, "sharded state in ", dir, ": rank file ", path,
                " of the set of ", ranks, " rank(s) is missing");
    const SafetensorsFile f = load_safetensors(path);  // every checksum verified (IOError naming the tensor)
    auto meta = [&](const char* key) {
      auto m = f.metadata.find(key);
      return m == f.metadata.end() ? std::string("?") : m->second;
    };
    REMAT_CHECK(meta("step") == std::to_string(step) && meta("rank") == std::to_string(r) &&
                    meta("ranks") == std::to_string(ranks),
                IOError, "sharded state in ", dir, ": ", path, " holds step ", meta("step"), ", rank ", meta("rank"),
                " of ", meta("ranks"), "; the index expects step ", step, ", rank ", r, " of ", ranks);
    for (const auto& [piece, t] : f.tensors) {
      const std::size_t at = piece.rfind('@');
      const std::string name = at == std::string::npos ? piece : piece.substr(0, at);
      auto w = whole.find(name);
      REMAT_CHECK(at != std::string::npos && w != whole.end() && t.dim() == 1 && t.dtype() == DType::f32, IOError,
                  "sharded state in ", dir, ": ", path, " holds '", piece, "', which is no piece of a tensor the index names");
      const std::int64_t begin = std::stoll(piece.substr(at + 1)), n = t.numel();
      REMAT_CHECK(begin >= 0 && begin + n <= w->second.numel(), IOError, "sharded state in ", dir, ": piece '", piece,
                  "' of ", path, " (", n, " elements) lies outside '", name, "' of ", w->second.numel());
      w->second.view({-1}).narrow(0, begin, n).copy_(t);
      covered[name] += n;
    }
  }
  for (const auto& [name, t] : whole) {
    REMAT_CHECK(covered[name] == t.numel(), IOError, "sharded state in ", dir, ": the pieces of '", name, "' in ",
                folder, " cover ", covered[name], " of its ", t.numel(), " elements");
    REMAT_CHECK(!file.tensors.count(name), IOError, "sharded state in ", dir, ": '", name,
                "' is both whole in the index and in shards");
    file.tensors[name] = t;
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
