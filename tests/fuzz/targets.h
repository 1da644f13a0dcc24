// Fuzz targets for remat's parsers of outside input: the JSON parser, the
// model config loader, the recompute plan parser and the safetensors reader
// (targets.cc); the Hugging Face tokenizer.json and tokenizer_config.json
// loaders (tokenizer_targets.cc); Hugging Face config.json and
// model.safetensors.index.json, the token-shard header and the in-memory
// safetensors decoder (model_file_targets.cc). The six later ones read from
// memory only, never through files.
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
// input and N is 4. Accepted plans must name only blocks in [0, N), each once,
// give each block region its policy and reentrant flag (never both), and
// print (str()) as a string that parses back to an equal plan.
bool plan(std::string_view input);
// load_safetensors on a file holding `input`; an accepted file must survive
// save_safetensors -> load_safetensors unchanged. The files of config and
// safetensors go to a folder of this process under $REMAT_FUZZ_TMPDIR, else
// /dev/shm, else the system temp folder, removed at a normal exit.
bool safetensors(std::string_view input);

// BpeTokenizer::from_json of `input` as a tokenizer.json (no config). An
// accepted tokenizer must encode a few fixed texts and `input` itself the
// same way twice, with ids in [0, vocab_size()) that decode to valid UTF-8;
// its EOS/BOS ids (if any) are in range too. Encode may throw remat::Error
// (a regex over its match limit).
bool tokenizer(std::string_view input);
// BpeTokenizer::from_json of a fixed small tokenizer.json with `input` as its
// tokenizer_config.json; an accepted config gives EOS/BOS ids in
// [0, vocab_size()) that decode.
bool tokenizer_config(std::string_view input);
// config_from_hf of `input` parsed as JSON. An accepted config is valid,
// survives ModelConfig's to_json -> from_json (what a saved state does), and
// exports (config_to_hf) to a config.json that imports back to the same
// config, with the passed-through keys kept.
bool hf_config(std::string_view input);
// parse_hf_index of `input`; an accepted index maps each tensor to a plain
// file name, and total_size (if any) is >= 0.
bool hf_index(std::string_view input);
// parse_shard_header of `input` as a whole shard file; an accepted header
// describes exactly the input's bytes (64 + count x token bytes, computed
// without overflow) with a vocabulary in [1, 2^32] and EOS -1 or in
// [0, vocab), and every token it counts reads back from the input.
bool token_shard(std::string_view input);
// decode_safetensors of `input` (in memory). An accepted file re-encodes and
// decodes to the same tensors and metadata (with checksums), and
// SafetensorsReader::from_bytes agrees with it tensor by tensor: read(),
// read_into(), and bf16/f16 read as f32 equal to a cast of the stored tensor.
bool safetensors_decode(std::string_view input);

struct Target {
  std::string name;
  bool (*run)(std::string_view);  // true: accepted
};
// Every target above, by name ("json", "config", "plan", "safetensors",
// "tokenizer", "tokenizer_config", "hf_config", "hf_index", "token_shard",
// "safetensors_decode").
const std::vector<Target>& targets();

}  // namespace remat::fuzz
