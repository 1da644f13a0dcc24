// The test binaries tests/parallel/mpi_test.sh runs under mpirun opt in to
// the remat tool's comm watchdog, as `remat` does, so a rank stuck in a
// collective exits after REMAT_COMM_TIMEOUT instead of hanging the run.
#include "tools/comm_watchdog.h"

namespace {
const bool installed = (remat::tools::install_comm_failure_handling(), true);
}  // namespace
