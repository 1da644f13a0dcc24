#include "engine/recompute_context.h"

namespace remat {

namespace {
thread_local int tls_depth = 0;
}  // namespace

bool in_recompute() { return tls_depth > 0; }
int recompute_depth() { return tls_depth; }
RecomputeScope::RecomputeScope() { ++tls_depth; }
RecomputeScope::~RecomputeScope() { --tls_depth; }

}  // namespace remat
