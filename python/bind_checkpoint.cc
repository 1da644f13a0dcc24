// Checkpoint regions, selective save policies, plans, and the scopes that
// offload, compress or dynamically rematerialize saved tensors, from Python.
//
//   y = remat.checkpoint(block, x, w, reentrant=False, policy=remat.save_ops(["matmul"]))
//
// A policy is a remat.Policy (the built-in ones), a list of op names to
// save, or any Python callable op_name -> remat.SaveDecision (or a bool:
// True saves). The region function is called again by backward's replay,
// with the GIL taken.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/compress.h"
#include "checkpoint/dynamic_remat.h"
#include "checkpoint/offload.h"
#include "checkpoint/plan.h"
#include "checkpoint/policy.h"
#include "python/bindings.h"

namespace remat::python {
namespace {

// A Python policy: decision or bool from the callable; anything else is a
// TypeError naming the op asked about.
Policy python_policy(const py::function& fn) {
  PyRef f(fn);
  return [f](const std::string& op) {
    py::gil_scoped_acquire gil;
    py::object r = call_python(f.get(), op);
    if (py::isinstance<SaveDecision>(r)) return r.cast<SaveDecision>();
    if (py::isinstance<py::bool_>(r)) return r.cast<bool>() ? SaveDecision::must_save : SaveDecision::must_recompute;
    throw py::type_error("a checkpoint policy must return a remat.SaveDecision or a bool for op '" + op +
                         "', got a " + std::string(py::str(r.get_type().attr("__name__"))));
  };
}

Policy policy_arg(const py::object& p) {
  if (p.is_none()) return nullptr;
  if (py::isinstance<Policy>(p)) return p.cast<Policy>();
  if (py::isinstance<py::list>(p) || py::isinstance<py::tuple>(p)) return save_ops(p.cast<std::vector<std::string>>());
  if (py::isinstance<py::function>(p) || py::hasattr(p, "__call__")) return python_policy(p);
  throw py::type_error("policy: a remat.Policy, a list of op names to save, or a callable op -> "
                       "remat.SaveDecision, not a " + std::string(py::str(p.get_type().attr("__name__"))));
}

py::object checkpoint_call(const py::function& fn, const py::args& args, bool reentrant, const py::object& policy,
                           bool early_stop, bool determinism_check, const std::string& name) {
  CheckpointOptions o;
  o.name = name;
  o.reentrant = reentrant;
  o.early_stop = early_stop;
  o.determinism_check = determinism_check;
  o.policy = policy_arg(policy);
  std::vector<Tensor> inputs;
  for (const py::handle& h : args) {
    if (!py::isinstance<Tensor>(h))
      throw py::type_error("remat.checkpoint passes tensors to the region: argument " +
                           std::to_string(inputs.size()) + " is a " +
                           std::string(py::str(h.get_type().attr("__name__"))) +
                           " (bind other values into the function, e.g. with functools.partial)");
    inputs.push_back(h.cast<Tensor>());
  }
  PyRef f(fn);
  const RegionFn region = [f, name](const std::vector<Tensor>& in) {
    py::gil_scoped_acquire gil;
    return tensors_from_result(call_python(f.get(), *py::cast(in)), "checkpoint region '" + name + "'");
  };
  return tensors_to_result(checkpoint(region, inputs, o));
}

py::dict counters_dict() {
  const CheckpointCounters c = checkpoint_counters();
  py::dict d;
  d["regions"] = c.regions;
  d["replays"] = c.replays;
  d["early_stops"] = c.early_stops;
  d["ops_recomputed"] = c.ops_recomputed;
  d["tensors_regenerated"] = c.tensors_regenerated;
  d["bytes_regenerated"] = c.bytes_regenerated;
  d["ops_skipped"] = c.ops_skipped;
  d["replay_ms"] = double(c.replay_ns) / 1e6;
  return d;
}

void bind_policies(py::module_& m) {
  py::enum_<SaveDecision>(m, "SaveDecision", "What a selective policy says about an op's saves in a region.")
      .value("must_save", SaveDecision::must_save)
      .value("prefer_save", SaveDecision::prefer_save)
      .value("must_recompute", SaveDecision::must_recompute)
      .value("prefer_recompute", SaveDecision::prefer_recompute);
  py::class_<Policy>(m, "Policy", "A built-in selective save policy (a callable op -> SaveDecision).")
      .def("__call__", [](const Policy& p, const std::string& op) { return p(op); });
  m.def("recompute_all", &recompute_all);
  m.def("save_matmul_outputs", &save_matmul_outputs);
  m.def("save_attention_outputs", &save_attention_outputs);
  m.def("save_ops", &save_ops, py::arg("ops"));
}

void bind_plan(py::module_& m) {
  py::class_<RecomputePlan>(m, "Plan", "A recompute plan (docs/RECOMPUTE.md): which blocks and parts run as "
                                       "checkpoint regions, and what is offloaded or compressed.")
      .def_static("parse", [](const std::string& spec, std::int64_t n_layers) {
        return RecomputePlan::parse(spec, n_layers);
      }, py::arg("spec"), py::arg("n_layers"))
      .def_readonly("spec", &RecomputePlan::spec)
      .def_readonly("n_layers", &RecomputePlan::n_layers)
      .def_readonly("block_regions", &RecomputePlan::block_regions)
      .def_readonly("modules", &RecomputePlan::modules)
      .def_readonly("offload", &RecomputePlan::offload)
      .def_readonly("compress", &RecomputePlan::compress)
      .def_readonly("chunked_loss", &RecomputePlan::chunked_loss)
      .def_readonly("dynamic", &RecomputePlan::dynamic)
      .def("is_none", &RecomputePlan::is_none)
      .def("__str__", &RecomputePlan::str)
      .def("__repr__", [](const RecomputePlan& p) { return "remat.Plan.parse(\"" + p.str() + "\")"; })
      .def("__eq__", &RecomputePlan::operator==);
}

void bind_memory_scopes(py::module_& m) {
  m.def("offload_saved_tensors", [](std::size_t min_bytes, const std::string& dir, bool synchronous) {
    OffloadOptions o;
    o.min_bytes = min_bytes;
    o.dir = dir;
    o.synchronous = synchronous;
    auto hooks = std::make_shared<OffloadHooks>(o);
    return hooks_scope(hooks, py::cast(hooks));
  }, py::arg("min_bytes") = 64 * 1024, py::arg("dir") = "", py::arg("synchronous") = false,
     "A context manager: saves of min_bytes or more inside it are written to a spill file in dir (the temp "
     "folder by default) and read back for backward.");
  py::class_<OffloadHooks, std::shared_ptr<OffloadHooks>>(m, "OffloadHooks")
      .def("stats", [](const OffloadHooks& h) {
        const OffloadStats s = h.stats();
        py::dict d;
        d["saves"] = s.saves;
        d["bytes_taken"] = s.bytes_taken;
        d["bytes_written"] = s.bytes_written;
        d["bytes_read"] = s.bytes_read;
        d["stored_peak"] = s.stored_peak;
        return d;
      });
  m.def("compress_saved_tensors", [](const std::string& format, bool all_saves, std::size_t min_bytes) {
    CompressOptions o;
    o.format = compress_format_from_name(format);
    o.all_saves = all_saves;
    o.min_bytes = min_bytes;
    auto hooks = std::make_shared<CompressHooks>(o);
    return hooks_scope(std::move(hooks));
  }, py::arg("format") = "fp8", py::arg("all_saves") = false, py::arg("min_bytes") = 4096,
     "A context manager: matmul inputs (all_saves: every floating save) saved inside it are kept in bf16 or "
     "fp8 (MXFP8) and widened for backward (lossy).");
  py::class_<DynamicRemat, std::shared_ptr<DynamicRemat>>(m, "DynamicRemat")
      .def("stats", [](const DynamicRemat& r) {
        const DynamicRematStats s = r.stats();
        py::dict d;
        d["evictions"] = s.evictions;
        d["evicted_bytes"] = s.evicted_bytes;
        d["rebuilds"] = s.rebuilds;
        d["rebuild_ms"] = s.rebuild_ms;
        d["evictable_bytes"] = s.evictable_bytes;
        return d;
      })
      .def("evict_all", &DynamicRemat::evict_all);
  m.def("dynamic_remat", [](std::int64_t budget, const py::object& device) {
    DynamicRematOptions o;
    o.budget = budget;
    o.device = device_arg(device);
    auto r = std::make_shared<DynamicRemat>(o);
    return scope_context([r] { return std::make_shared<DynamicRematScope>(r); }, py::cast(r));
  }, py::arg("budget"), py::arg("device") = "cpu",
     "A context manager: dynamic rematerialization (DTR) keeps allocated bytes on device under budget by "
     "evicting saved tensors and recomputing them when backward needs them.");
}

}  // namespace

void bind_checkpoint(py::module_& m) {
  bind_policies(m);
  m.def("checkpoint", &checkpoint_call, py::arg("fn"), py::arg("reentrant") = false,
        py::arg("policy") = py::none(), py::arg("early_stop") = true, py::arg("determinism_check") = true,
        py::arg("name") = "checkpoint",
        "Runs fn(*args) as a checkpoint region: its saved tensors are dropped and recomputed by backward "
        "(policy: which ops' saves to keep). Returns what fn returns.");
  m.def("checkpoint_counters", &counters_dict);
  m.def("reset_checkpoint_counters", &reset_checkpoint_counters);
  bind_plan(m);
  bind_memory_scopes(m);
}

}  // namespace remat::python
