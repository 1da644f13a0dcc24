// A build without CUDA: no NCCL.
#include "parallel/nccl_group.h"

namespace remat {

bool nccl_available() { return false; }

std::shared_ptr<ProcessGroup> nccl_group(const std::shared_ptr<ProcessGroup>&, int) {
  throw Error("nccl_group: this build of remat has no CUDA (and so no NCCL); use the MPI group for CPU tensors");
}

}  // namespace remat
