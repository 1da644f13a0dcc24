// remat's error hierarchy. Every error the engine raises is a remat::Error;
// the subclasses let a caller react to one kind (an OOM, a shape mismatch)
// without parsing messages. Messages name the op, the operands and what was
// expected.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace remat {

// Base of every exception thrown by remat.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Operand shapes do not fit the op (broadcast, matmul inner dims, view sizes).
class ShapeError : public Error {
 public:
  using Error::Error;
};

// An operand has a dtype the op does not accept, or dtypes do not match.
class DTypeError : public Error {
 public:
  using Error::Error;
};

// Operands live on different devices, or a device is not available.
class DeviceError : public Error {
 public:
  using Error::Error;
};

// The caching allocator could not satisfy a request; the message states the
// request and the allocator's state. The allocator stays usable afterwards.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

// A checkpoint replay did not reproduce what the original forward saved.
class CheckpointMismatchError : public Error {
 public:
  using Error::Error;
};

// Autograd misuse: backward through a freed graph, a saved tensor modified in
// place, grad of a tensor that does not require grad.
class AutogradError : public Error {
 public:
  using Error::Error;
};

// Reading or writing a file failed, or a file is truncated or corrupt.
class IOError : public Error {
 public:
  using Error::Error;
};

namespace detail {

// Streams every argument into one string.
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

}  // namespace detail
}  // namespace remat

// REMAT_CHECK(cond, ErrorType, message parts...): throws ErrorType with the
// concatenated message when cond is false.
#define REMAT_CHECK(cond, ErrorType, ...)                           \
  do {                                                              \
    if (!(cond)) throw ErrorType(::remat::detail::concat(__VA_ARGS__)); \
  } while (0)
