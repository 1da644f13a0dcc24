// An interrupted Hugging Face export: a fault after each step of
// save_hf_model (ExportStep, every weights file included) over a folder that
// holds an older export leaves the old model, the new one, or a folder that
// refuses to load, never a mix (new weights under the old config.json, or
// some tensors of each).
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/error.h"
#include "models/decoder.h"
#include "tests/files.h"
#include "train/hf_files.h"
#include "train/hf_model.h"

namespace {

using namespace remat;
namespace fs = std::filesystem;

struct InjectedFault {};

// Installs a hook that throws InjectedFault at the n-th (0-based) time
// `step` is reached, and removes it when it goes.
class FaultAt {
 public:
  FaultAt(ExportStep step, int n) {
    // (The hook is copied each time it runs: the count lives outside it.)
    set_export_fault_hook([step, n, seen = std::make_shared<int>(0)](ExportStep s) {
      if (s == step && (*seen)++ == n) throw InjectedFault{};
    });
  }
  ~FaultAt() { set_export_fault_hook(nullptr); }
  FaultAt(const FaultAt&) = delete;
  FaultAt& operator=(const FaultAt&) = delete;
};

// A model's parameters by name, as f32 values.
using Weights = std::map<std::string, std::vector<float>>;
Weights weights_of(const DecoderModel& m) {
  Weights w;
  for (const auto& [name, p] : m.named_parameters()) w[name] = p.to(DType::f32).to_vector<float>();
  return w;
}

struct Export {
  ModelConfig config;
  std::unique_ptr<DecoderModel> model;
  Weights weights;
};

// A tiny model under `seed`; `theta` makes the configs differ where the
// shapes do not (a mix would load silently with the wrong rope).
Export make_export(std::uint64_t seed, double theta) {
  Export e;
  e.config = ModelConfig::named("tiny");
  e.config.rope_theta = theta;
  e.model = std::make_unique<DecoderModel>(e.config, seed);
  e.weights = weights_of(*e.model);
  return e;
}

// What loading `dir` gives: "old", "new", "refused", or "MIXED" (a test failure).
std::string classify(const std::string& dir, const Export& old_e, const Export& new_e) {
  std::unique_ptr<DecoderModel> loaded;
  try {
    loaded = load_hf_model(dir, old_e.config.batch, old_e.config.seq);
  } catch (const Error&) {
    return "refused";
  }
  const Weights w = weights_of(*loaded);
  const double theta = loaded->config().rope_theta;
  if (w == old_e.weights && theta == old_e.config.rope_theta) return "old";
  if (w == new_e.weights && theta == new_e.config.rope_theta) return "new";
  return "MIXED";
}

void copy_folder(const std::string& from, const std::string& to) {
  fs::remove_all(to);
  fs::copy(from, to, fs::copy_options::recursive);
}

}  // namespace

TEST_CASE("an export interrupted after any step leaves the old model, the new one, or a refusal", "[hf][export]") {
  const Export old_e = make_export(1, 10000.0), new_e = make_export(2, 50000.0);
  const std::string root = test::temp_dir("hf-export-fault");
  // Old: one file or several shards; new: one file or several shards.
  for (const std::int64_t old_shard : {std::int64_t(5'000'000'000), std::int64_t(400'000)}) {
    for (const std::int64_t new_shard : {std::int64_t(5'000'000'000), std::int64_t(400'000)}) {
      const std::string base = root + "/base";
      fs::remove_all(base);
      HfExportOptions old_o, new_o;
      old_o.max_shard_bytes = old_shard;
      new_o.max_shard_bytes = new_shard;
      save_hf_model(base, old_e.config, old_e.model->named_parameters(), old_o);
      REQUIRE(classify(base, old_e, new_e) == "old");
      // How many weights files the new export writes (a fault after each).
      int files = 0;
      {
        const std::string probe = root + "/probe";
        copy_folder(base, probe);
        set_export_fault_hook([&](ExportStep s) { files += s == ExportStep::shard; });
        save_hf_model(probe, new_e.config, new_e.model->named_parameters(), new_o);
        set_export_fault_hook(nullptr);
        REQUIRE(classify(probe, old_e, new_e) == "new");
      }
      INFO("old shard bytes " << old_shard << ", new " << new_shard << ", new files " << files);
      CHECK((new_shard < 1'000'000 ? files > 1 : files == 1));
      std::vector<std::pair<ExportStep, int>> faults = {{ExportStep::cleared, 0}};
      for (int i = 0; i < files; ++i) faults.emplace_back(ExportStep::shard, i);
      for (ExportStep s : {ExportStep::weights, ExportStep::tokenizer, ExportStep::done}) faults.emplace_back(s, 0);
      for (const auto& [step, n] : faults) {
        INFO("fault after step " << int(step) << " #" << n);
        const std::string dir = root + "/run";
        copy_folder(base, dir);
        {
          FaultAt fault(step, n);
          CHECK_THROWS_AS(save_hf_model(dir, new_e.config, new_e.model->named_parameters(), new_o), InjectedFault);
        }
        const std::string got = classify(dir, old_e, new_e);
        CHECK(got != "MIXED");
        // Only the last step has the whole new model; before it, nothing loads.
        CHECK(got == (step == ExportStep::done ? "new" : "refused"));
      }
    }
  }
}
