// Immortal<T>: a function-local singleton that is constructed on first use and
// never destroyed, so objects with static storage (tensors in a user's global,
// allocators used by exit handlers) never outlive what they depend on.
#pragma once

#include <new>
#include <utility>

namespace remat::detail {

template <typename T>
class Immortal {
 public:
  template <typename... Args>
  explicit Immortal(Args&&... args) {
    new (storage_) T(std::forward<Args>(args)...);
  }
  Immortal(const Immortal&) = delete;
  Immortal& operator=(const Immortal&) = delete;

  T& get() { return *std::launder(reinterpret_cast<T*>(storage_)); }

 private:
  alignas(T) unsigned char storage_[sizeof(T)];
};

}  // namespace remat::detail
