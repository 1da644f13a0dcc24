// Whether ops record autograd history on this thread.
#pragma once

namespace remat {

// True when ops run with grad enabled record nodes for backward (default true).
bool grad_enabled();
void set_grad_enabled(bool enabled);

// RAII: disables autograd recording on this thread for the scope's lifetime.
class NoGradGuard {
 public:
  NoGradGuard() : previous_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// RAII: enables autograd recording (inside a no_grad region, for example).
class EnableGradGuard {
 public:
  EnableGradGuard() : previous_(grad_enabled()) { set_grad_enabled(true); }
  ~EnableGradGuard() { set_grad_enabled(previous_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace remat
