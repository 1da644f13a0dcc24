// Models from Python: configs, DecoderModel (built from a config or a
// Hugging Face folder), its loss and logits under any recompute plan,
// tokenizers, generation, and batches drawn from token shards.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "checkpoint/plan.h"
#include "engine/json.h"
#include "models/config.h"
#include "models/decoder.h"
#include "models/generate.h"
#include "models/lora.h"
#include "models/recompute.h"
#include "python/bindings.h"
#include "tokenizer/tokenizer.h"
#include "train/data.h"
#include "train/hf_model.h"

namespace remat::python {
namespace {

ModelConfig config_arg(const py::object& c) {
  if (py::isinstance<ModelConfig>(c)) return c.cast<ModelConfig>();
  if (py::isinstance<py::str>(c)) return ModelConfig::load(c.cast<std::string>());
  throw py::type_error("a model config is a remat.ModelConfig, a config name (\"tiny\", ...) or a .json path");
}

void bind_config(py::module_& m) {
  py::class_<ModelConfig>(m, "ModelConfig", "A decoder's architecture and run shape (models/config.h).")
      .def(py::init([](const std::string& name) { return ModelConfig::load(name); }), py::arg("name_or_path"))
      .def_static("from_json", [](const std::string& text) { return ModelConfig::from_json(Json::parse(text)); })
      .def_static("names", &ModelConfig::names)
      .def("to_json", [](const ModelConfig& c) { return c.to_json().dump(); })
      .def("validate", &ModelConfig::validate)
      .def_readwrite("name", &ModelConfig::name)
      .def_readwrite("vocab", &ModelConfig::vocab)
      .def_readwrite("d_model", &ModelConfig::d_model)
      .def_readwrite("n_layers", &ModelConfig::n_layers)
      .def_readwrite("n_heads", &ModelConfig::n_heads)
      .def_readwrite("kv_heads", &ModelConfig::kv_heads)
      .def_readwrite("ffn", &ModelConfig::ffn)
      .def_readwrite("seq", &ModelConfig::seq)
      .def_readwrite("batch", &ModelConfig::batch)
      .def_readwrite("experts", &ModelConfig::experts)
      .def_readwrite("top_k", &ModelConfig::top_k)
      .def_readwrite("moe_ffn", &ModelConfig::moe_ffn)
      .def_readwrite("dropout", &ModelConfig::dropout)
      .def_readwrite("arch", &ModelConfig::arch)
      .def_readwrite("tie_embeddings", &ModelConfig::tie_embeddings)
      .def_readwrite("freeze", &ModelConfig::freeze)
      .def_property("lora", [](const ModelConfig& c) { return c.lora.enabled() ? c.lora.str() : std::string(); },
                    [](ModelConfig& c, const std::string& spec) { c.lora = spec.empty() ? LoraConfig{} : LoraConfig::parse(spec); },
                    "LoRA adapters as the --lora spec (\"r=16,alpha=32,targets=q_proj,v_proj\"; \"\": none)")
      .def("__repr__", [](const ModelConfig& c) { return "remat.ModelConfig.from_json('" + c.to_json().dump() + "')"; });
}

void bind_output(py::module_& m) {
  py::class_<MoELayerStats>(m, "RoutingStats")
      .def_readonly("layer", &MoELayerStats::layer)
      .def_readonly("tokens_per_expert", &MoELayerStats::tokens_per_expert)
      .def_readonly("imbalance", &MoELayerStats::imbalance)
      .def_readonly("dropped", &MoELayerStats::dropped)
      .def_readonly("aux", &MoELayerStats::aux);
  py::class_<DecoderModel::Output>(m, "ModelOutput", "forward_loss's result.")
      .def_readonly("loss", &DecoderModel::Output::loss, "ce + aux_coef * aux (0-dim; backward from here)")
      .def_readonly("ce", &DecoderModel::Output::ce)
      .def_readonly("aux", &DecoderModel::Output::aux)
      .def_readonly("routing", &DecoderModel::Output::routing);
}

void bind_decoder(py::module_& m) {
  py::class_<DecoderModel, std::shared_ptr<DecoderModel>>(m, "DecoderModel", "A decoder-only transformer (dense "
                                                                           "or MoE; models/decoder.h).")
      .def(py::init([](const py::object& config, std::uint64_t seed) {
        return std::make_shared<DecoderModel>(config_arg(config), seed);
      }), py::arg("config"), py::arg("seed") = 0, "Seeded weights for config (a ModelConfig or a name).")
      .def_property_readonly("config", [](const DecoderModel& md) { return md.config(); },
                             "A copy of the model's config (the model keeps its own).")
      .def("forward_loss", [](const DecoderModel& md, const Tensor& tokens) {
        py::gil_scoped_release nogil;
        return md.forward_loss(tokens);
      }, py::arg("tokens"), "Mean next-token cross-entropy of tokens [B, S + 1] (i64), plus the MoE terms.")
      .def("forward", [](const DecoderModel& md, const Tensor& ids) {
        py::gil_scoped_release nogil;
        return md.forward(ids);
      }, py::arg("input_ids"), "Logits [B, S, vocab] of input_ids [B, S].")
      .def("__call__", [](const DecoderModel& md, const Tensor& ids) {
        py::gil_scoped_release nogil;
        return md.forward(ids);
      })
      .def("named_parameters", [](const DecoderModel& md) { return md.named_parameters(); })
      .def("parameters", [](const DecoderModel& md) { return md.parameters(); })
      .def("trainable_parameters", [](const DecoderModel& md) { return md.trainable_parameters(); })
      .def("parameter", &DecoderModel::parameter, py::arg("name"))
      .def("num_parameters", &DecoderModel::num_parameters)
      .def("zero_grad", &DecoderModel::zero_grad)
      .def("train", &DecoderModel::train, py::arg("mode") = true)
      .def("eval", [](DecoderModel& md) { md.train(false); })
      .def("to", [](DecoderModel& md, const py::object& d) { md.to(device_arg(d)); }, py::arg("device"))
      .def("set_compute_dtype", [](DecoderModel& md, const py::object& t) { md.set_compute_dtype(dtype_arg(t)); },
           py::arg("dtype"), "f32, or bf16/f16 mixed precision (f32 masters).")
      .def("set_plan", [](DecoderModel& md, const py::object& plan) {
        const RecomputePlan p = py::isinstance<RecomputePlan>(plan)
            ? plan.cast<RecomputePlan>() : RecomputePlan::parse(plan.cast<std::string>(), md.config().n_layers);
        apply_recompute_plan(md, p);
      }, py::arg("plan"), "Runs the blocks under a recompute plan (a remat.Plan or its string: \"per_block\", "
         "\"uniform:2+offload\", ...). For \"auto\" under a memory budget, train through remat.Trainer "
         "(recompute=\"auto\", memory_budget=...), whose planner profiles the step.");
  m.def("load_hf_model", [](const std::string& dir, std::int64_t batch, std::int64_t seq, const py::object& device,
                            const std::string& lora) {
    const Device where = device_arg(device);  // (Python objects: before the GIL goes)
    const LoraConfig adapters = lora.empty() ? LoraConfig{} : LoraConfig::parse(lora);
    py::gil_scoped_release nogil;
    return std::shared_ptr<DecoderModel>(load_hf_model(dir, batch, seq, where, adapters));
  }, py::arg("dir"), py::arg("batch") = 1, py::arg("seq") = 128, py::arg("device") = "cpu", py::arg("lora") = "",
     "A Hugging Face folder's model with its weights (Llama, Qwen2, Qwen2-MoE, Mixtral); lora adds adapters.");
}

void bind_tokenizer_and_data(py::module_& m) {
  py::class_<Tokenizer, std::shared_ptr<Tokenizer>>(m, "Tokenizer", "A Hugging Face tokenizer.json (BPE) or a "
                                                                   "SentencePiece .model.")
      .def(py::init([](const std::string& path) { return std::shared_ptr<Tokenizer>(load_tokenizer(path)); }),
           py::arg("path"))
      .def("encode", [](const Tokenizer& t, const std::string& text) { return t.encode(text); }, py::arg("text"))
      .def("decode", &Tokenizer::decode, py::arg("ids"))
      .def_property_readonly("vocab_size", &Tokenizer::vocab_size)
      .def_property_readonly("eos_id", &Tokenizer::eos_id)
      .def_property_readonly("bos_id", &Tokenizer::bos_id);
  // Batches [batch, seq + 1] of token ids drawn from shards (or a text file),
  // as the Trainer draws them; an endless iterator.
  struct Batches {
    Corpus corpus;
    std::unique_ptr<BatchSampler> sampler;
  };
  py::class_<Batches>(m, "Batches", "Seeded random batches [batch, seq + 1] (i64) of a corpus's training split.")
      .def("__iter__", [](Batches& b) -> Batches& { return b; }, py::return_value_policy::reference_internal)
      .def("__next__", [](Batches& b) { return b.sampler->next(); })
      .def_property_readonly("vocab", [](const Batches& b) { return b.corpus.vocab; });
  m.def("batches", [](const std::string& path, std::int64_t batch, std::int64_t seq, std::uint64_t seed,
                      double val_fraction) {
    auto b = std::make_unique<Batches>();
    b->corpus = is_shard_data(path) ? shard_corpus(path, seq + 1, val_fraction) : text_corpus(path, seq + 1, val_fraction);
    b->sampler = std::make_unique<BatchSampler>(b->corpus.train_source(), batch, seq, seed);
    return b;
  }, py::arg("path"), py::arg("batch"), py::arg("seq"), py::arg("seed") = 0, py::arg("val_fraction") = 0.1,
     "Batches from token shards (a *.tok file or a folder, ./remat tokenize) or a text file (bytes).");
  m.def("generate", [](const DecoderModel& md, const std::vector<std::int32_t>& prompt, std::int64_t max_new,
                       double temperature, std::int64_t top_k, double top_p, std::uint64_t seed,
                       std::optional<std::int32_t> stop) {
    GenerateOptions o;
    o.max_new = max_new;
    o.temperature = temperature;
    o.top_k = top_k;
    o.top_p = top_p;
    o.seed = seed;
    o.stop = stop;
    py::gil_scoped_release nogil;
    return generate(md, prompt, o);
  }, py::arg("model"), py::arg("prompt"), py::arg("max_new") = 64, py::arg("temperature") = 1.0,
     py::arg("top_k") = 0, py::arg("top_p") = 1.0, py::arg("seed") = 0, py::arg("stop") = py::none(),
     "Token ids after prompt (KV-cached sampling; temperature 0: greedy).");
}

}  // namespace

void bind_models(py::module_& m) {
  bind_config(m);
  bind_output(m);
  bind_decoder(m);
  bind_tokenizer_and_data(m);
}

}  // namespace remat::python
