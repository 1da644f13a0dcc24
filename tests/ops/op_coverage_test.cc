// Every op in the op table is covered, in the spirit of ggml's
// test-backend-ops: it has a case in tests/ops/op_cases.cc that calls it and
// passes a finite-difference gradient check on the CPU, a CUDA-vs-CPU
// comparison (tests/cuda/op_compare_test.cc, run where a GPU exists), a
// bench-ops row (tools/bench_ops.cc), and a line in the op table of
// docs/REFERENCE.md. The few ops that cannot have one are in the allowlists
// below, each with its reason. The test prints the coverage table.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "engine/op_def.h"
#include "engine/op_hooks.h"
#include "tests/ops/op_cases.h"
#include "tools/bench_ops.h"

using namespace remat;
using namespace remat::testing;

namespace {

// Ops with no finite-difference check: not differentiable.
const std::map<std::string, std::string> kNoGradcheck = {
    {"add_", "in place, not differentiable"},
    {"mul_", "in place, not differentiable"},
    {"mul_scalar_", "in place, not differentiable"},
    {"zero_", "in place, not differentiable"},
    {"copy_", "in place, not differentiable"},
};

// Ops not compared between the CPU and CUDA by the cases.
const std::map<std::string, std::string> kNoCudaComparison = {
    {"all_to_all", "CUDA collectives need NCCL and several ranks (tests/parallel)"},
    {"all_reduce", "CUDA collectives need NCCL and several ranks (tests/parallel)"},
    {"all_gather", "CUDA collectives need NCCL and several ranks (tests/parallel)"},
    {"reduce_scatter", "CUDA collectives need NCCL and several ranks (tests/parallel)"},
    {"tp_copy", "CUDA collectives need NCCL and several ranks (tests/parallel)"},
    {"tp_reduce", "CUDA collectives need NCCL and several ranks (tests/parallel)"},
    {"tp_gather", "CUDA collectives need NCCL and several ranks (tests/parallel)"},
    {"tp_scatter", "CUDA collectives need NCCL and several ranks (tests/parallel)"},
    {"tp_gather_whole", "CUDA collectives need NCCL and several ranks (tests/parallel)"},
    {"tp_split", "CUDA collectives need NCCL and several ranks (tests/parallel)"},
    {"sp_column_linears", "CPU only: tensor parallelism runs under MPI (tests/parallel)"},
    {"vocab_parallel_cross_entropy", "CPU only: tensor parallelism runs under MPI (tests/parallel)"},
};

// Ops without a bench-ops row.
const std::map<std::string, std::string> kNoBenchRow = {
    {"all_to_all", "communication: bench --ep times it inside the step"},
    {"all_reduce", "communication: bench --dp times it inside the step"},
    {"all_gather", "communication: bench --dp times it inside the step"},
    {"reduce_scatter", "communication: bench --dp times it inside the step"},
    {"tp_copy", "communication: times inside the step of train --tp"},
    {"tp_reduce", "communication: times inside the step of train --tp"},
    {"tp_gather", "communication: times inside the step of train --tp"},
    {"tp_scatter", "communication: times inside the step of train --tp"},
    {"tp_gather_whole", "communication: times inside the step of train --tp --sp"},
    {"tp_split", "communication: times inside the step of train --tp --sp"},
    {"sp_column_linears", "communication and GEMMs: times inside the step of train --tp --sp"},
};

// The op names listed in docs/REFERENCE.md's op table: rows "| `name` | ...".
std::set<std::string> documented_ops() {
  std::ifstream in("docs/REFERENCE.md");
  REQUIRE(in.good());
  std::set<std::string> names;
  std::string line;
  bool in_table = false;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) in_table = line == "## Ops";
    if (in_table && line.rfind("| `", 0) == 0) names.insert(line.substr(3, line.find('`', 3) - 3));
  }
  return names;
}

// The op table without the ops tests define for themselves.
std::vector<const OpDef*> built_in_ops() {
  std::vector<const OpDef*> ops;
  for (const OpDef* op : op_table())
    if (std::string(op->name()).rfind("test_", 0) != 0) ops.push_back(op);
  return ops;
}

// Records the names of the ops called.
struct Names final : OpHook {
  void after(const OpCall& c, const std::vector<Tensor>&) override { called.insert(c.name); }
  std::set<std::string> called;
};

}  // namespace

TEST_CASE("every op has a gradcheck, a CUDA comparison, a bench row and a doc line", "[ops][coverage]") {
  std::map<std::string, int> grad_cases, cuda_cases, bench_rows;
  for (const OpCase& c : op_cases()) {
    grad_cases[c.op] += c.grad.has_value();
    cuda_cases[c.op] += c.cuda.has_value();
  }
  for (const auto& b : tools::bench_op_cases()) bench_rows[b.op]++;
  const std::set<std::string> docs = documented_ops();

  auto mark = [](int n, const std::map<std::string, std::string>& allow, const std::string& op) -> std::string {
    if (n > 0) return "yes";
    return allow.count(op) ? "n/a" : "MISSING";
  };
  std::ostringstream table;
  table << "op                             gradcheck  cuda-vs-cpu  bench  docs   kernels\n";
  std::vector<std::string> missing;
  for (const OpDef* op : built_in_ops()) {
    const std::string n = op->name();
    const std::string g = mark(grad_cases[n], kNoGradcheck, n), cu = mark(cuda_cases[n], kNoCudaComparison, n),
                      be = mark(bench_rows[n], kNoBenchRow, n), doc = docs.count(n) ? "yes" : "MISSING";
    std::string kernels;
    for (DeviceType t : op->kernel_devices()) kernels += std::string(kernels.empty() ? "" : ",") + device_type_name(t);
    char line[200];
    std::snprintf(line, sizeof line, "%-30s %-10s %-12s %-6s %-6s %s\n", n.c_str(), g.c_str(), cu.c_str(), be.c_str(),
                  doc.c_str(), kernels.empty() ? "(runs other ops)" : kernels.c_str());
    table << line;
    for (const auto& [what, v] : {std::pair{"gradcheck", g}, {"CUDA comparison", cu}, {"bench row", be},
                                  {"docs/REFERENCE.md row", doc}})
      if (v == "MISSING") missing.push_back(n + ": no " + what);
  }
  std::printf("%s", table.str().c_str());
  INFO(table.str());
  for (const auto& m : missing) FAIL_CHECK(m);
  CHECK(missing.empty());
}

TEST_CASE("every case calls its op and passes its gradient check", "[ops][coverage]") {
  for (const OpCase& c : op_cases()) {
    INFO(c.op << " (" << c.what << ")");
    auto names = std::make_shared<Names>();
    const std::vector<Tensor> inputs = c.inputs();
    {
      OpHookScope scope(names);
      const Tensor y = c.fn(inputs);
      CHECK(y.defined());
    }
    CHECK(names->called.count(c.op) == 1);
    if (!c.grad) continue;
    const GradcheckResult r = gradcheck(c.fn, inputs, *c.grad);
    INFO(r.report());
    CHECK(r.ok);
  }
}

TEST_CASE("the cases and allowlists name only ops in the table", "[ops][coverage]") {
  std::set<std::string> ops;
  for (const OpDef* op : built_in_ops()) ops.insert(op->name());
  for (const OpCase& c : op_cases()) CHECK(ops.count(c.op) == 1);
  for (const auto& b : tools::bench_op_cases()) CHECK(ops.count(b.op) == 1);
  for (const auto* allow : {&kNoGradcheck, &kNoCudaComparison, &kNoBenchRow})
    for (const auto& [op, why] : *allow) {
      INFO(op << ": " << why);
      CHECK(ops.count(op) == 1);
    }
  // An allowlisted op has no case of that kind (else the entry is stale).
  for (const OpCase& c : op_cases()) {
    if (c.grad) CHECK(kNoGradcheck.count(c.op) == 0);
    if (c.cuda) CHECK(kNoCudaComparison.count(c.op) == 0);
  }
  for (const auto& b : tools::bench_op_cases()) CHECK(kNoBenchRow.count(b.op) == 0);
  // Every documented op exists (a renamed or removed op leaves no stale row).
  for (const std::string& d : documented_ops()) {
    INFO("docs/REFERENCE.md lists `" << d << "`");
    CHECK(ops.count(d) == 1);
  }
}
