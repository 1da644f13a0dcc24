// The caching allocator from Python: statistics, peaks, a memory limit, the
// bytes held for backward, and the allocation history with its HTML
// timeline (the page `./remat mem` writes, tools/mem_timeline.h) for any
// code a notebook runs:
//
//   with remat.record_memory() as rec:
//       loss = model.forward_loss(batch).loss
//       rec.mark("backward")
//       loss.backward()
//   rec.save_html("step.html")
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <fstream>
#include <set>
#include <string>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "python/bindings.h"
#include "tools/mem_timeline.h"

namespace remat::python {
namespace {

py::dict stats_dict(const MemoryStats& s) {
  py::dict d;
  d["allocated_bytes"] = s.allocated_bytes;
  d["allocated_peak"] = s.allocated_peak;
  d["reserved_bytes"] = s.reserved_bytes;
  d["reserved_peak"] = s.reserved_peak;
  d["requested_bytes"] = s.requested_bytes;
  d["num_allocs"] = s.num_allocs;
  d["num_frees"] = s.num_frees;
  d["num_device_allocs"] = s.num_device_allocs;
  d["cache_hits"] = s.cache_hits;
  d["num_ooms"] = s.num_ooms;
  py::dict now, at_peak;
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
    now[category_name(MemoryCategory(c))] = s.category_bytes[c];
    at_peak[category_name(MemoryCategory(c))] = s.category_bytes_at_peak[c];
  }
  d["categories"] = now;
  d["categories_at_peak"] = at_peak;
  return d;
}

py::dict event_dict(const MemoryEvent& e) {
  py::dict d;
  d["seq"] = e.seq;
  d["time_ns"] = e.time_ns;
  d["kind"] = event_kind_name(e.kind);
  d["ptr"] = e.ptr;
  d["size"] = e.size;
  d["category"] = category_name(e.category);
  d["tag"] = e.tag;
  d["allocated_after"] = e.allocated_after;
  d["reserved_after"] = e.reserved_after;
  return d;
}

// The devices being recorded now. Only touched with the GIL held (enter
// and exit are Python calls), which serialises them.
std::set<std::string>& recording_devices() {
  static std::set<std::string> devices;
  return devices;
}

// One recording of a device's allocator: history on from __enter__ to
// __exit__, with the bytes held when it started.
class MemoryRecorder {
 public:
  MemoryRecorder(Device device, std::size_t capacity, std::string label)
      : alloc_(allocator_for(device)), capacity_(capacity) {
    rec_.config = std::move(label);
    rec_.plan = "python";
  }
  MemoryRecorder& enter() {
    REMAT_CHECK(!on_, Error, "remat.record_memory: this recorder is already recording");
    // One recording per allocator: the history is the allocator's, and a
    // nested one ending would end the outer one's too.
    REMAT_CHECK(recording_devices().insert(alloc_.device().str()).second, Error, "remat.record_memory: ",
                alloc_.device().str(), "'s allocator is already being recorded (one recording at a time per device)");
    alloc_.reset_peak();
    const MemoryStats before = alloc_.stats();
    rec_.initial_bytes = before.category_bytes;
    rec_.initial_reserved = before.reserved_bytes;
    rec_.events.clear();
    alloc_.enable_history(capacity_);
    alloc_.mark("forward");  // the first phase, until the caller marks another
    on_ = true;
    return *this;
  }
  void exit() {
    if (!on_) return;
    alloc_.mark("end");
    rec_.events = alloc_.history();
    alloc_.enable_history(0);
    on_ = false;
    recording_devices().erase(alloc_.device().str());
  }
  ~MemoryRecorder() { exit(); }
  void mark(const std::string& label) {
    REMAT_CHECK(on_, Error, "remat.record_memory: mark(\"", label, "\") outside the with-block that records");
    alloc_.mark(label);
  }
  const tools::MemRecording& recording() const {
    REMAT_CHECK(!on_, Error, "remat.record_memory: the recording is read after the with-block ends");
    return rec_;
  }

 private:
  CachingAllocator& alloc_;
  std::size_t capacity_;
  bool on_ = false;
  tools::MemRecording rec_;
};

void bind_recorder(py::module_& m) {
  py::class_<MemoryRecorder>(m, "MemoryRecorder", "The allocator history of a with-block (remat.record_memory).")
      .def("__enter__", &MemoryRecorder::enter, py::return_value_policy::reference)
      .def("__exit__", [](MemoryRecorder& r, const py::args&) {
        r.exit();
        return false;
      })
      .def("mark", &MemoryRecorder::mark, py::arg("label"),
           "Starts a phase (\"backward\", \"optimizer\", ...): the timeline shades and names it.")
      .def("events", [](const MemoryRecorder& r) {
        py::list out;
        for (const MemoryEvent& e : r.recording().events) out.append(event_dict(e));
        return out;
      })
      .def("peak_bytes", [](const MemoryRecorder& r) -> std::int64_t {
        const tools::Timeline t = tools::build_timeline(r.recording());
        return t.points.empty() ? 0 : t.points[t.peak_point].allocated;
      }, "The highest allocated bytes the recording saw.")
      .def("json", [](const MemoryRecorder& r) {
        return tools::timeline_json(r.recording(), tools::build_timeline(r.recording()));
      })
      .def("html", [](const MemoryRecorder& r) {
        return tools::timeline_html(r.recording(), tools::build_timeline(r.recording()));
      }, "The timeline as a self-contained HTML page (inline SVG), e.g. for IPython.display.HTML.")
      .def("save_html", [](const MemoryRecorder& r, const std::string& path) {
        std::ofstream out(path, std::ios::binary);
        REMAT_CHECK(out.good(), IOError, "remat.MemoryRecorder.save_html: cannot write ", path);
        out << tools::timeline_html(r.recording(), tools::build_timeline(r.recording()));
        REMAT_CHECK(out.good(), IOError, "remat.MemoryRecorder.save_html: writing ", path, " failed");
      }, py::arg("path"));
  m.def("record_memory", [](const py::object& device, std::size_t capacity, const std::string& label) {
    return std::make_unique<MemoryRecorder>(device_arg(device), capacity, label);
  }, py::arg("device") = "cpu", py::arg("capacity") = 1 << 20, py::arg("label") = "python",
     "A context manager recording every allocation and free on device (at most capacity events) for a "
     "timeline; phases start with rec.mark(label).");
}

}  // namespace

void bind_memory(py::module_& m) {
  py::enum_<MemoryCategory>(m, "MemoryCategory")
      .value("parameter", MemoryCategory::parameter).value("gradient", MemoryCategory::gradient)
      .value("optimizer", MemoryCategory::optimizer).value("activation", MemoryCategory::activation)
      .value("recompute", MemoryCategory::recompute).value("workspace", MemoryCategory::workspace)
      .value("communication", MemoryCategory::communication).value("other", MemoryCategory::other)
      .value("loss", MemoryCategory::loss);
  m.def("memory_stats", [](const py::object& d) { return stats_dict(allocator_for(device_arg(d)).stats()); },
        py::arg("device") = "cpu", "The caching allocator's statistics (bytes, peaks, per category).");
  m.def("reset_peak_memory_stats", [](const py::object& d) { allocator_for(device_arg(d)).reset_peak(); },
        py::arg("device") = "cpu");
  m.def("empty_cache", [](const py::object& d) { allocator_for(device_arg(d)).empty_cache(); },
        py::arg("device") = "cpu");
  m.def("set_memory_limit", [](std::int64_t bytes, const py::object& d) {
    if (bytes < 0) throw py::value_error("remat.set_memory_limit: " + std::to_string(bytes) + " bytes (0 lifts the limit)");
    allocator_for(device_arg(d)).set_memory_limit(bytes);
  }, py::arg("bytes"), py::arg("device") = "cpu",
     "Caps the allocator's reserved bytes (0: none): beyond it an allocation raises remat.OutOfMemoryError.");
  m.def("memory_summary", [](const py::object& d) { return allocator_for(device_arg(d)).describe(); },
        py::arg("device") = "cpu");
  m.def("memory_category", [](MemoryCategory c) {
    return scope_context([c] { return std::make_shared<CategoryScope>(c); });
  }, py::arg("category"), "A context manager: allocations inside it are counted under category.");
  m.def("saved_bytes", [] {
    const SavedBytesReport r = saved_bytes_report();
    py::dict d;
    d["live_bytes"] = r.live_bytes;
    d["peak_bytes"] = r.peak_bytes;
    d["activation_live_bytes"] = r.activation_live_bytes;
    d["activation_peak_bytes"] = r.activation_peak_bytes;
    d["live_count"] = r.live_count;
    d["bytes_by_op"] = r.bytes_by_op;
    return d;
  }, "The bytes autograd holds for backward now and at their peak, and by the op that saved them.");
  m.def("reset_saved_bytes_peak", &reset_saved_bytes_peak);
  bind_recorder(m);
}

}  // namespace remat::python
