// Training from Python: the Trainer with the train command's options
// (keyword arguments are its flags: recompute="auto", memory_budget="50%",
// model="DIR", lora="r=16", ...), driven a step at a time, and
// remat.optim.AdamW for one's own loop.
//
//   t = remat.Trainer(config="tiny", steps=100, recompute="per_block")
//   for _ in range(100):
//       stats = t.step()       # the --log line of the step, as a dict
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "train/optimizer.h"
#include "train/trainer.h"
#include "python/bindings.h"
#include "tools/commands.h"

namespace remat::python {
namespace {

// Keyword arguments as the train command's flags: model_dir="x" ->
// --model-dir x; True -> --flag; False and None -> left out.
std::vector<std::string> flags_from_kwargs(const py::kwargs& kwargs) {
  std::vector<std::string> args;
  for (const auto& [key, value] : kwargs) {
    std::string flag = "--" + key.cast<std::string>();
    for (char& c : flag)
      if (c == '_') c = '-';
    if (value.is_none()) continue;
    if (py::isinstance<py::bool_>(value)) {
      if (value.cast<bool>()) args.push_back(flag);
      continue;
    }
    args.push_back(flag);
    args.push_back(py::str(value).cast<std::string>());
  }
  return args;
}

// The step's figures as the --log line has them (a dict from its JSON).
py::object stats_dict(const Trainer& t, const StepStats& s) {
  StepLogKeys keys;
  keys.pipeline = t.pipeline() != nullptr;
  keys.comm = t.world_size() > 1 || keys.pipeline || t.tensor_parallel();
  keys.moe = keys.pipeline && t.options().config.experts > 0;
  keys.dynamic = t.model().block_stack().dynamic_remat() != nullptr;
  keys.seq = t.options().seq_range.has_value();
  return py::module_::import("json").attr("loads")(s.to_json(keys));
}

void bind_trainer(py::module_& m) {
  py::class_<TrainOptions>(m, "TrainOptions", "A training run's options (train/train_options.h).")
      .def_static("from_args", &tools::train_options_from_args, py::arg("args"),
                  "The options ./remat train ARGS would use (the same flags and errors).")
      .def_readwrite("steps", &TrainOptions::steps)
      .def_readwrite("seed", &TrainOptions::seed)
      .def_readwrite("lr", &TrainOptions::lr)
      .def_readwrite("recompute", &TrainOptions::recompute)
      .def_readwrite("save_dir", &TrainOptions::save_dir)
      .def_readwrite("eval_every", &TrainOptions::eval_every)
      .def_readwrite("config", &TrainOptions::config);
  py::class_<Trainer>(m, "Trainer", "The training loop (train/trainer.h).")
      .def(py::init([](const py::kwargs& kwargs) {
        const std::vector<std::string> args = flags_from_kwargs(kwargs);
        py::gil_scoped_release nogil;  // (the planner of recompute="auto" profiles steps)
        return std::make_unique<Trainer>(tools::train_options_from_args(args));
      }), "Keyword arguments are ./remat train's flags (dashes as underscores): config=\"tiny\", steps=100, "
          "recompute=\"auto\", memory_budget=\"50%\", model=\"HF_DIR\", lora=\"r=16\", data=\"SHARDS\", ...")
      .def(py::init([](const TrainOptions& o) {
        py::gil_scoped_release nogil;
        return std::make_unique<Trainer>(o);
      }), py::arg("options"))
      .def("step", [](Trainer& t) {
        StepStats s;
        {
          py::gil_scoped_release nogil;  // other Python threads run during the step
          s = t.train_step();
        }
        return stats_dict(t, s);
      }, "Runs the next step (evaluating and saving when due); returns its --log figures as a dict.")
      .def("run", [](Trainer& t) {
        py::gil_scoped_release nogil;
        t.run(nullptr);
      }, "Runs the remaining steps.")
      .def("evaluate", [](Trainer& t) {
        py::gil_scoped_release nogil;
        return t.evaluate();
      }, "Mean held-out loss.")
      .def("save", [](const Trainer& t, const std::string& dir) {
        py::gil_scoped_release nogil;
        t.save(dir);
      }, py::arg("dir"))
      .def("resume", [](Trainer& t, const std::string& dir) {
        py::gil_scoped_release nogil;
        t.resume(dir);
      }, py::arg("dir"))
      .def_property_readonly("steps_done", &Trainer::step)
      .def_property_readonly("options", [](const Trainer& t) { return t.options(); },
                             "A copy of the run's options (recompute: the plan auto chose).")
      .def_property_readonly("model", [](Trainer& t) -> DecoderModel& { return t.model(); },
                             py::return_value_policy::reference_internal)
      .def_property_readonly("rank", &Trainer::rank)
      .def_property_readonly("world_size", &Trainer::world_size);
}

// AdamW with its learning rate and its parameters (for zero_grad).
struct PyAdamW {
  std::unique_ptr<AdamW> opt;
  double lr = 1e-3;
  std::vector<Tensor> params;
};

void bind_optim(py::module_& m) {
  py::module_ optim = m.def_submodule("optim", "Optimizers for one's own training loop.");
  // `import remat.optim` finds the submodule too.
  py::module_::import("sys").attr("modules")["remat.optim"] = optim;
  py::class_<PyAdamW>(optim, "AdamW", "AdamW with decoupled weight decay (train/optimizer.h) over f32 leaves; "
                                      "tensors of 2 or more dims decay.")
      .def(py::init([](const py::iterable& params, double lr, double beta1, double beta2, double eps,
                       double weight_decay) {
        std::vector<std::pair<std::string, Tensor>> named;
        for (const py::handle& h : params) {
          if (py::isinstance<Tensor>(h)) {
            named.emplace_back("param" + std::to_string(named.size()), h.cast<Tensor>());
            continue;
          }
          const bool pair = py::isinstance<py::tuple>(h) && py::len(h) == 2 &&
                            py::isinstance<py::str>(h[py::int_(0)]) && py::isinstance<Tensor>(h[py::int_(1)]);
          if (!pair)
            throw py::type_error("remat.optim.AdamW: params holds remat.Tensor values or (name, Tensor) pairs "
                                 "(model.trainable_parameters()); item " + std::to_string(named.size()) + " is " +
                                 std::string(py::repr(h)));
          named.push_back(h.cast<std::pair<std::string, Tensor>>());
        }
        AdamWOptions o;
        o.beta1 = beta1;
        o.beta2 = beta2;
        o.eps = eps;
        o.weight_decay = weight_decay;
        PyAdamW w;
        for (const auto& [name, t] : named) w.params.push_back(t);
        w.opt = std::make_unique<AdamW>(std::move(named), o);
        w.lr = lr;
        return w;
      }), py::arg("params"), py::arg("lr") = 1e-3, py::arg("beta1") = 0.9, py::arg("beta2") = 0.95,
         py::arg("eps") = 1e-8, py::arg("weight_decay") = 0.1,
         "params: tensors, or (name, tensor) pairs as model.trainable_parameters() gives.")
      .def_readwrite("lr", &PyAdamW::lr)
      .def("step", [](PyAdamW& w) {
        py::gil_scoped_release nogil;
        w.opt->step(w.lr);
      }, "One update from the parameters' .grad at the current lr.")
      .def("zero_grad", [](PyAdamW& w) {
        for (Tensor& t : w.params)
          if (t.grad().defined()) t.grad().zero_();
      })
      .def_property_readonly("steps", [](const PyAdamW& w) { return w.opt->steps(); });
}

}  // namespace

void bind_training(py::module_& m) {
  bind_trainer(m);
  bind_optim(m);
  m.def("clip_grad_norm", &clip_grad_norm, py::arg("params"), py::arg("max_norm"),
        "Scales the gradients so their global norm is at most max_norm; returns the norm before.");
}

}  // namespace remat::python
