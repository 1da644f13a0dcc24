#include "train/state_reader.h"

#include "engine/grad_mode.h"

namespace remat {

StateReader::StateReader(const std::string& dir, const std::string& path)
    : file_(path), set_(ShardedSetReader::open(dir, file_.metadata())) {
  if (!set_) return;
  for (const std::string& name : set_->names())
    REMAT_CHECK(!file_.has(name), IOError, "sharded state in ", dir, ": '", name,
                "' is both whole in the index and in shards");
}

bool StateReader::has(const std::string& name) const { return (set_ && set_->has(name)) || file_.has(name); }

const Shape& StateReader::shape(const std::string& name) const {
  return set_ && set_->has(name) ? set_->shape(name) : file_.shape(name);
}

DType StateReader::dtype(const std::string& name) const {
  return set_ && set_->has(name) ? DType::f32 : file_.dtype(name);
}

Tensor StateReader::read(const std::string& name) const {
  return set_ && set_->has(name) ? set_->read(name) : file_.read(name);
}

void StateReader::read_range(const std::string& name, std::int64_t begin, Tensor& dst) const {
  if (set_ && set_->has(name)) return set_->read_range(name, begin, dst);
  const Shape& whole = file_.shape(name);
  if (begin == 0 && dst.numel() == shape_numel(whole) && dst.is_contiguous()) {
    Tensor as_stored = dst.view(whole);
    return file_.read_into(name, as_stored);  // (verified as it is read)
  }
  file_.verify(name);
  file_.read_range_into(name, begin, dst);
}

void StateReader::verify_range(const std::string& name, std::int64_t begin, std::int64_t n) const {
  if (set_ && set_->has(name)) return set_->verify_range(name, begin, n);
  file_.verify(name);
}

void read_state_tensor(const StateReader& reader, const std::string& name, Tensor& dst) {
  NoGradGuard ng;
  if (dst.device().is_cpu() && dst.is_contiguous()) {
    Tensor flat = dst.view({-1});
    reader.read_range(name, 0, flat);
    return;
  }
  dst.copy_(reader.read(name));
}

}  // namespace remat
