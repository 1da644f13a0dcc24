#include "checkpoint/output_discard.h"

#include "engine/recompute_context.h"

namespace remat {

namespace {

thread_local std::int64_t tls_regenerations = 0;

// One forward's output as its saves share it: how many saves hold the
// recipe, and the regenerated output while any of them is still to unpack.
struct Shared {
  std::int64_t saves = 0;
  Tensor output;
};

// What a save of the discarded output holds instead of its data.
struct Recipe {
  std::shared_ptr<const DiscardedOutput::Producer> producer;
  std::shared_ptr<const std::vector<Tensor>> inputs;
  std::shared_ptr<Shared> shared;
};

class DiscardHooks final : public TypedSavedTensorHooks {
 public:
  // The hooks see the inputs only weakly: recipes keep them alive, and they
  // go when the last recipe is released.
  DiscardHooks(const char* name, const Tensor& output, DiscardedOutput::Producer producer,
               const std::shared_ptr<const std::vector<Tensor>>& inputs)
      : name_(name),
        storage_(output.impl().storage.get()),
        sizes_(output.sizes()),
        strides_(output.strides()),
        offset_(output.storage_offset()),
        producer_(std::make_shared<const DiscardedOutput::Producer>(std::move(producer))),
        inputs_(inputs) {}

  std::string name() const override { return std::string("output-discard '") + name_ + "'"; }

  // Only saves of the discarded output itself (same storage and layout).
  bool wants(const Tensor& t, const SaveInfo&) const override {
    return t.impl().storage.get() == storage_ && t.sizes() == sizes_ && t.strides() == strides_ &&
           t.storage_offset() == offset_;
  }

  std::any pack_tensor(const Tensor&, const SaveInfo& info) override {
    auto inputs = inputs_.lock();
    REMAT_CHECK(inputs != nullptr, Error, "output-discard '", name_, "': a save of its output by op '", info.op,
                "' after the DiscardedOutput was destroyed");
    for (const auto& in : *inputs) saved_bytes_hold(in, "output_discard_inputs", info.region);
    if (!shared_ || shared_->saves == 0) shared_ = std::make_shared<Shared>();  // (a new forward of the region)
    ++shared_->saves;
    return Recipe{producer_, inputs, shared_};
  }

  void on_release(const std::any& packed, const SaveInfo& info) override {
    const Recipe& r = std::any_cast<const Recipe&>(packed);
    for (const auto& in : *r.inputs) saved_bytes_release(in, "output_discard_inputs", info.region);
    if (--r.shared->saves == 0) r.shared->output = Tensor();  // (the last save: the regenerated output goes)
  }

  Tensor unpack_tensor(std::any packed, const SaveInfo&) override {
    const Recipe& r = std::any_cast<const Recipe&>(packed);
    if (r.shared->output.defined()) return r.shared->output;
    RecomputeScope replaying;
    NoGradGuard no_grad;
    CategoryScope cat(MemoryCategory::recompute);
    ++tls_regenerations;
    std::vector<Tensor> in;
    for (const auto& t : *r.inputs) in.push_back(t.defined() ? t.detach() : t);
    r.shared->output = (*r.producer)(in);
    return r.shared->output;
  }

  std::size_t held_bytes(const std::any&) const override { return 0; }  // a recipe holds no data of its own

 private:
  const char* name_;
  const Storage* storage_;
  Shape sizes_, strides_;
  std::int64_t offset_;
  std::shared_ptr<const DiscardedOutput::Producer> producer_;
  std::weak_ptr<const std::vector<Tensor>> inputs_;
  std::shared_ptr<Shared> shared_;  // the saves of this forward's output
};

}  // namespace

DiscardedOutput::DiscardedOutput(const char* name, Producer producer, std::vector<Tensor> inputs)
    : inputs_(std::make_shared<const std::vector<Tensor>>(std::move(inputs))) {
  output_ = producer(*inputs_);
  hooks_ = std::make_shared<DiscardHooks>(name, output_, std::move(producer), inputs_);
}

std::int64_t DiscardedOutput::regenerations() { return tls_regenerations; }

}  // namespace remat
