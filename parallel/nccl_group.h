// The NCCL back end of ProcessGroup, for CUDA tensors. The communicator is
// bootstrapped by broadcasting NCCL's unique id over an MPI group (the world
// under mpirun); the all_to_all count exchange and barrier go through that
// group too. Collectives run on the current device's default stream and
// return when they are done; while waiting, NCCL's asynchronous error state
// is polled, and a collective past the comm timeout aborts the communicator
// and throws an Error naming it.
//
// Sends and receives (isend / irecv) are queued and launched together, one
// ncclGroupStart/End of ncclSend / ncclRecv of the tensors' bytes, at the
// group's next wait, test, collective or blocking send/recv, and waited for
// through an event like the collectives (in flight, comm timeout). NCCL has
// no tags: messages between two ranks match in the order they were started
// (the tag only names the op), and sizes must agree (not checked).
#pragma once

#include <memory>

#include "parallel/process_group.h"

namespace remat {

// True when this build has NCCL (a CUDA build).
bool nccl_available();

// An NCCL group over the ranks of `bootstrap`, rank r using CUDA device
// `device` (each rank its own device). A collective over `bootstrap`. Throws
// Error in a build without CUDA.
std::shared_ptr<ProcessGroup> nccl_group(const std::shared_ptr<ProcessGroup>& bootstrap, int device);

}  // namespace remat
