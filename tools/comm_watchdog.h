// What the remat tool does when a peer rank fails: process-level handling
// that the library leaves to programs (parallel/process_group.h).
#pragma once

namespace remat::tools {

// Opt-in, once, before any collective (main() calls it; test binaries that
// run under mpirun may too). From the first collective (or wait on a send /
// receive) of a group of several ranks on:
//  - a watchdog thread ends the process with exit code 1 when a collective,
//    send or receive runs past comm_timeout(), after a line on stderr
//    naming it (collective_in_flight());
//  - SIGTERM (what the launcher sends when a peer dies) ends the process
//    with exit code 1, naming the collective, send or receive it was in, if
//    any.
// Reads REMAT_COMM_TIMEOUT (seconds; the default of set_comm_timeout, which a
// later --comm-timeout overrides) and, for the tests, REMAT_FAULT:
// "kill:RANK:N" or "hang:RANK:N" makes world rank RANK (OMPI_COMM_WORLD_RANK)
// die by SIGKILL or stop answering when it starts its N-th counted operation
// (collectives, sends and receives alike, as ProcessGroup counts them). A
// malformed REMAT_FAULT is ignored, as before.
void install_comm_failure_handling();

}  // namespace remat::tools
