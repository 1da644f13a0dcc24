// Fuzz targets for remat's parsers of outside input: the JSON parser, the
// model config loader, the recompute plan parser and the safetensors reader.
//
// Each target feeds one input to its parser and returns normally when the
// parser accepts it (true) or rejects it with a remat::Error (false; the
// project's typed errors). Anything else is a finding: another exception escapes, the
// process crashes, a sanitizer reports, or an accepted input breaks the
// target's invariant (a round trip through the writer, in-range indices),
// which aborts with a message on stderr.
//
// The libFuzzer binaries (tests/fuzz/BUILD, built by tools/fuzz.sh) and the
// corpus replay test (replay_test.cc) both call these.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace remat::fuzz {

// Json::parse, then dump -> parse -> dump must reproduce the first dump.
bool json(std::string_view input);
// ModelConfig::load of a .json file holding `input` (in the folder below);
// an accepted config must survive to_json -> text -> from_json.
bool config(std::string_view input);
// RecomputePlan::parse. Input: "N\nSPEC" parses SPEC for N layers (N in
// [1, 4096], clamped); without a leading decimal line, SPEC is the whole
// input and N is 4. Accepted plans must name only blocks in [0, N), each once.
bool plan(std::string_view input);
// load_safetensors on a file holding `input`; an accepted file must survive
// save_safetensors -> load_safetensors unchanged. The files of config and
// safetensors go to a folder of this process under $REMAT_FUZZ_TMPDIR, else
// /dev/shm, else the system temp folder, removed at a normal exit.
bool safetensors(std::string_view input);

struct Target {
  std::string name;
  bool (*run)(std::string_view);  // true: accepted
};
// Every target above, by name ("json", "config", "plan", "safetensors").
const std::vector<Target>& targets();

}  // namespace remat::fuzz
