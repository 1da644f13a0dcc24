#include "train/pipeline.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <sstream>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/grad_mode.h"
#include "engine/rng.h"
#include "ops/loss.h"
#include "ops/ops.h"

namespace remat {

PipelineSchedule parse_pipeline_schedule(const std::string& name) {
  if (name == "gpipe") return PipelineSchedule::gpipe;
  if (name == "1f1b") return PipelineSchedule::one_f_one_b;
  throw Error("--pp-schedule '" + name + "': expected gpipe (all forwards, then all backwards) or 1f1b");
}

const char* pipeline_schedule_name(PipelineSchedule s) { return s == PipelineSchedule::gpipe ? "gpipe" : "1f1b"; }

std::vector<PipelineOp> pipeline_ops(PipelineSchedule schedule, std::int64_t stages, std::int64_t stage,
                                     std::int64_t micro_batches) {
  REMAT_CHECK(stages >= 1 && stage >= 0 && stage < stages && micro_batches >= 1, Error, "pipeline_ops: stage ", stage,
              " of ", stages, " with ", micro_batches, " micro-batches (need 0 <= stage < stages, micro-batches >= 1)");
  const std::int64_t M = micro_batches;
  std::vector<PipelineOp> ops;
  if (schedule == PipelineSchedule::gpipe) {
    for (std::int64_t m = 0; m < M; ++m) ops.push_back({true, m});
    for (std::int64_t m = 0; m < M; ++m) ops.push_back({false, m});
    return ops;
  }
  // 1F1B: warm-up forwards so that the last stage's first backward can
  // start as soon as possible, then alternate, then drain.
  const std::int64_t warmup = std::min(M, stages - stage - 1);
  std::int64_t f = 0, b = 0;
  for (; f < warmup; ++f) ops.push_back({true, f});
  while (f < M) {
    ops.push_back({true, f++});
    ops.push_back({false, b++});
  }
  while (b < M) ops.push_back({false, b++});
  return ops;
}

std::int64_t max_in_flight(const std::vector<PipelineOp>& ops) {
  std::int64_t now = 0, most = 0;
  for (const PipelineOp& op : ops) {
    now += op.forward ? 1 : -1;
    most = std::max(most, now);
  }
  return most;
}

std::vector<std::int64_t> balanced_stages(const std::vector<std::int64_t>& block_params, std::int64_t first_extra,
                                          std::int64_t last_extra, std::int64_t stages) {
  const auto n = std::int64_t(block_params.size());
  REMAT_CHECK(stages >= 1 && n >= stages, Error, "--pp ", stages, ": the model has ", n,
              " blocks; every stage needs at least one");
  std::vector<std::int64_t> prefix(std::size_t(n + 1), 0);
  for (std::int64_t i = 0; i < n; ++i) prefix[std::size_t(i + 1)] = prefix[std::size_t(i)] + block_params[std::size_t(i)];
  auto cost = [&](std::int64_t s, std::int64_t a, std::int64_t b) {  // stage s holding blocks [a, b)
    return prefix[std::size_t(b)] - prefix[std::size_t(a)] + (s == 0 ? first_extra : 0) +
           (s == stages - 1 ? last_extra : 0);
  };
  // best[s][b]: the least largest stage over stages 0..s holding blocks [0, b).
  const std::int64_t inf = std::numeric_limits<std::int64_t>::max();
  std::vector<std::vector<std::int64_t>> best(std::size_t(stages), std::vector<std::int64_t>(std::size_t(n + 1), inf));
  std::vector<std::vector<std::int64_t>> from(best.size(), std::vector<std::int64_t>(std::size_t(n + 1), -1));
  for (std::int64_t b = 1; b <= n; ++b) best[0][std::size_t(b)] = cost(0, 0, b);
  for (std::int64_t s = 1; s < stages; ++s)
    for (std::int64_t b = s + 1; b <= n; ++b)
      for (std::int64_t a = s; a < b; ++a) {  // stage s holds [a, b)
        if (best[std::size_t(s - 1)][std::size_t(a)] == inf) continue;
        const std::int64_t v = std::max(best[std::size_t(s - 1)][std::size_t(a)], cost(s, a, b));
        if (v < best[std::size_t(s)][std::size_t(b)]) {
          best[std::size_t(s)][std::size_t(b)] = v;
          from[std::size_t(s)][std::size_t(b)] = a;
        }
      }
  std::vector<std::int64_t> bounds(std::size_t(stages + 1));
  bounds[std::size_t(stages)] = n;
  for (std::int64_t s = stages - 1, b = n; s > 0; --s) {
    b = from[std::size_t(s)][std::size_t(b)];
    bounds[std::size_t(s)] = b;
  }
  bounds[0] = 0;
  return bounds;
}

std::vector<std::int64_t> balanced_stages(const DecoderModel& model, std::int64_t stages) {
  const std::string layers = "model.layers.";
  std::vector<std::int64_t> block_params(std::size_t(model.config().n_layers), 0);
  std::int64_t embedding = 0, head = model.output_weight().numel();
  for (const auto& [name, p] : model.named_parameters()) {
    if (name.rfind("model.embed_tokens.", 0) == 0) embedding += p.numel();
    if (name.rfind("model.norm.", 0) == 0) head += p.numel();
    if (name.rfind(layers, 0) == 0)
      block_params[std::size_t(std::stoll(name.substr(layers.size())))] += p.numel();
  }
  return balanced_stages(block_params, embedding, head, stages);
}

std::vector<std::int64_t> parse_pp_split(const std::string& text, std::int64_t blocks, std::int64_t stages) {
  std::vector<std::int64_t> bounds = {0};
  std::stringstream ss(text);
  std::string part;
  auto bad = [&](const std::string& why) {
    return Error("--pp-split '" + text + "': " + why + "; expected " + std::to_string(stages - 1) +
                 " increasing block indices in (0, " + std::to_string(blocks) + "), e.g. the first block of each "
                 "stage after the first");
  };
  while (std::getline(ss, part, ',')) {
    std::size_t used = 0;
    std::int64_t v = 0;
    try {
      v = std::stoll(part, &used);
    } catch (const std::exception&) {
      throw bad("'" + part + "' is not a number");
    }
    if (used != part.size()) throw bad("'" + part + "' is not a number");
    if (v <= bounds.back() || v >= blocks) throw bad("boundary " + std::to_string(v) + " is out of order or range");
    bounds.push_back(v);
  }
  if (!text.empty() && text.back() == ',') throw bad("a trailing comma");
  if (std::int64_t(bounds.size()) != stages) throw bad(std::to_string(bounds.size() - 1) + " boundaries given");
  bounds.push_back(blocks);
  return bounds;
}

}  // namespace remat

// ---- the stage executor ----------------------------------------------------

namespace remat {

PipelineStage::PipelineStage(DecoderModel& model, std::shared_ptr<ProcessGroup> group, std::vector<std::int64_t> bounds,
                             PipelineSchedule schedule)
    : model_(model), group_(std::move(group)), bounds_(std::move(bounds)), schedule_(schedule) {
  const std::int64_t P = std::int64_t(bounds_.size()) - 1;
  REMAT_CHECK(P >= 1 && P == group_->size() && bounds_.front() == 0 && bounds_.back() == model.config().n_layers,
              Error, "PipelineStage: ", P, " stages over ", group_->size(), " ranks and ", model.config().n_layers,
              " blocks");
  stage_ = group_->rank();
  for (auto& [name, p] : model.named_parameters())
    if (owner(name) == stage_) owned_.emplace_back(name, p);
  // A block-level region across a stage boundary cannot run: refused here,
  // on every rank, before any stage waits for another.
  for (const auto& region : model.block_stack().plan().block_regions)
    for (std::int64_t b = 1; b < P; ++b)
      REMAT_CHECK(!(region.front() < bounds_[std::size_t(b)] && region.back() >= bounds_[std::size_t(b)]), Error,
                  "--pp ", P, ": the recompute plan's region over blocks ", region.front(), "-", region.back(),
                  " crosses the boundary before block ", bounds_[std::size_t(b)],
                  " (stage ", b, "); use per-block regions or groups inside each stage");
  // The other stages' weights: this rank never reads them (shapes stay).
  for (auto& [name, p] : model.named_parameters())
    if (owner(name) != stage_) p.release_storage();
  for (std::int64_t s = 0; s < P; ++s) {
    std::int64_t n = 0;
    for (std::int64_t i = bounds_[std::size_t(s)]; i < bounds_[std::size_t(s + 1)]; ++i) n += model.config().is_moe_layer(i);
    moe_layers_.push_back(n);
  }
}

std::int64_t PipelineStage::owner(const std::string& name) const {
  if (name.rfind("model.embed_tokens.", 0) == 0) return 0;
  if (name.rfind("model.norm.", 0) == 0 || name.rfind("lm_head.", 0) == 0) return stages() - 1;
  const std::string layers = "model.layers.";
  if (name.rfind(layers, 0) == 0) {
    const std::int64_t i = std::stoll(name.substr(layers.size(), name.find('.', layers.size()) - layers.size()));
    for (std::int64_t st = 0; st < stages(); ++st)
      if (bounds_[std::size_t(st)] <= i && i < bounds_[std::size_t(st + 1)]) return st;
  }
  throw Error("PipelineStage: parameter '" + name + "' belongs to no stage");
}

std::vector<std::pair<std::string, Tensor>> PipelineStage::gather_to_first(
    std::vector<std::pair<std::string, Tensor>> mine) {
  // Stage st sends a manifest (each tensor's name and shape, as text in an
  // i64 tensor, after its length), then its tensors in that order; rank 0
  // receives them in stage order.
  for (std::int64_t st = 1; st < stages(); ++st) {
    if (stage_ != 0 && stage_ != st) continue;
    if (stage_ == st) {
      std::string manifest;
      for (const auto& [name, t] : mine) {
        REMAT_CHECK(t.dtype() == DType::f32, DTypeError, "pipeline save: stage ", st, "'s tensor '", name, "' is ",
                    t.dtype(), ", expected f32");
        manifest += name;
        for (std::int64_t d : t.sizes()) manifest += " " + std::to_string(d);
        manifest += "\n";
      }
      const std::vector<std::int64_t> chars(manifest.begin(), manifest.end());
      group_->send(from_vector<std::int64_t>({std::int64_t(chars.size())}, {1}), 0, 0);
      group_->send(from_vector<std::int64_t>(chars, {std::int64_t(chars.size())}), 0, 1);
      int tag = 2;
      for (const auto& [name, t] : mine) group_->send(t.contiguous(), 0, tag++);
      continue;
    }
    Tensor length = empty({1}, DType::i64);
    group_->recv(length, int(st), 0);
    Tensor chars = empty({length.to_vector<std::int64_t>()[0]}, DType::i64);
    group_->recv(chars, int(st), 1);
    const std::vector<std::int64_t> codes = chars.to_vector<std::int64_t>();
    std::stringstream lines(std::string(codes.begin(), codes.end()));
    int tag = 2;
    for (std::string line; std::getline(lines, line);) {
      std::stringstream fields(line);
      std::string name;
      fields >> name;
      std::vector<std::int64_t> shape;
      for (std::int64_t d; fields >> d;) shape.push_back(d);
      Tensor t = empty(shape, DType::f32);
      group_->recv(t, int(st), tag++);
      mine.emplace_back(name, t);
    }
  }
  return mine;
}

std::vector<std::pair<std::string, Tensor>> PipelineStage::parameters() const { return owned_; }

// ---- one pass of the schedule ----------------------------------------------------

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }
}  // namespace

// One forward_backward call: its micro-batches' tensors, the sends in flight
// and the time spent waiting for a neighbour. Hidden states go to the next
// stage with tag 2m (micro-batch m), their gradients back with tag 2m + 1.
struct PipelineStage::Pass {
  // A micro-batch's tensors live from its forward to its backward; the loss
  // values are read at once, so nothing of it outlives its backward.
  struct Micro {
    Tensor x, y, ce;
    MoETerms terms;
    float ce_value = 0;
    std::vector<float> aux_values, z_values;
    void release_tensors() {
      x = y = ce = Tensor();
      terms = MoETerms{};
    }
  };
  // A send in flight with the tensor it reads (freed as it completes).
  struct Pending {
    std::shared_ptr<CommWork> work;
    Tensor buffer;
  };

  PipelineStage& stage;
  const Tensor& batch;
  const std::int64_t micro_batches, rows, seq;
  const double seed;
  const bool train;
  StepResult* timing;  // null: not timed (evaluation)
  const bool first, last;
  std::vector<Micro> mb;
  std::vector<Pending> pending;
  double idle = 0;        // ms waiting for a neighbour
  std::int64_t held = 0;  // micro-batches forwarded, backward not yet run

  Pass(PipelineStage& st, const Tensor& b, std::int64_t M, double sd, bool tr, StepResult* tm)
      : stage(st), batch(b), micro_batches(M), rows(b.size(0) / M), seq(b.size(1) - 1), seed(sd), train(tr),
        timing(tm), first(st.stage_ == 0), last(st.stage_ == st.stages() - 1), mb(std::size_t(M)) {}

  // A loss term's value (0 on meta, which has none: docs/META.md).
  static float value(const Tensor& t) { return t.device().is_meta() ? 0.0f : float(t.item()); }
  // A blocking receive, its wait counted as idle.
  void recv(Tensor& t, int src, int tag) {
    const auto t0 = Clock::now();
    stage.group_->recv(t, src, tag);
    idle += ms_since(t0);
  }
  // A non-blocking send of a contiguous copy of `t`.
  void send(const Tensor& t, int dst, int tag) {
    Tensor c = t.contiguous();
    pending.push_back({stage.group_->isend(c, dst, tag), c});
    if (timing) timing->sent_bytes += std::int64_t(c.nbytes());
  }
  // Frees the sends that completed.
  void reap() {
    pending.erase(std::remove_if(pending.begin(), pending.end(), [](Pending& p) { return p.work->test(); }),
                  pending.end());
  }
  // Waits for every send (counted as idle).
  void drain() {
    const auto t0 = Clock::now();
    for (Pending& p : pending) p.work->wait();
    idle += ms_since(t0);
    pending.clear();
  }

  // Forward of micro-batch m: the embedding or the previous stage's hidden
  // states, this stage's blocks, then the loss (last stage) or a send.
  void forward(std::int64_t m) {
    Micro& u = mb[std::size_t(m)];
    DecoderModel& model = stage.model_;
    const std::int64_t s = stage.stage_;
    const Tensor tokens = batch.narrow(0, m * rows, rows);
    BlockStack::SaveHooksScope hooks(model.block_stack());
    if (first) {
      u.x = model.embed(tokens.narrow(1, 0, seq).contiguous());
    } else {
      // (under sequence parallelism this rank's piece of the sequence)
      const auto& tp = model.tensor_parallel();
      const std::int64_t held = tp && tp->sp ? seq / tp->size() : seq;
      u.x = empty({rows, held, model.config().d_model}, TensorOptions(model.compute_dtype(), batch.device()));
      recv(u.x, int(s - 1), int(2 * m));
      if (train) u.x.set_requires_grad(true);
    }
    u.y = model.run_blocks(u.x, stage.bounds_[std::size_t(s)], stage.bounds_[std::size_t(s + 1)], u.terms);
    for (const Tensor& a : u.terms.aux) u.aux_values.push_back(value(a));
    for (const Tensor& z : u.terms.z) u.z_values.push_back(value(z));
    if (last) {
      u.ce = model.loss_head(u.y, tokens.narrow(1, 1, seq).contiguous());
      u.ce_value = value(u.ce);
    } else {
      send(u.y, int(s + 1), int(2 * m));
    }
    if (!train) u.release_tensors();
    reap();
    ++held;
    if (timing) timing->peak_in_flight = std::max(timing->peak_in_flight, held);
  }

  // Backward of micro-batch m: the output's gradient (or the loss seed) and
  // the MoE layers' loss terms, seeded as one process's loss would seed them
  // (d loss / d aux_i = seed * aux_coef); the input's gradient goes back.
  void backward(std::int64_t m, const std::function<void()>& before) {
    Micro& u = mb[std::size_t(m)];
    const auto& cfg = stage.model_.config();
    const std::int64_t s = stage.stage_;
    const Tensor seed_t = full({}, seed, TensorOptions(DType::f32, batch.device()));
    std::vector<Tensor> roots, grads;
    if (last) {
      roots.push_back(u.ce);
      grads.push_back(seed_t);
    } else {
      Tensor g = empty(u.y.sizes(), TensorOptions(u.y.dtype(), u.y.device()));
      recv(g, int(s + 1), int(2 * m + 1));
      roots.push_back(u.y);
      grads.push_back(g);
    }
    for (const Tensor& a : u.terms.aux) roots.push_back(a), grads.push_back(mul(seed_t, cfg.aux_coef));
    for (const Tensor& z : u.terms.z) roots.push_back(z), grads.push_back(mul(seed_t, cfg.z_coef));
    if (before) before();
    remat::backward(roots, grads);
    roots.clear();
    grads.clear();
    if (!first) send(u.x.grad(), int(s - 1), int(2 * m + 1));
    --held;
    u.release_tensors();  // this micro-batch's activations, graph and loss terms go
    reap();
  }

  // Every micro-batch's ce (the last stage's) and every stage's loss terms,
  // gathered to every rank and combined as one process's forward_loss:
  // the losses (ce when not training) of the `used` micro-batches, then their aux.
  std::vector<double> losses(std::int64_t used) const {
    // Per stage: [ce_0 .. ce_{used-1}, then per micro-batch the stage's aux
    // values, then its z values], padded to the longest stage.
    const auto& moe_layers = stage.moe_layers_;
    const std::int64_t per_stage_terms = *std::max_element(moe_layers.begin(), moe_layers.end());
    const DecoderModel& model = stage.model_;
    const bool with_z = model.config().z_coef > 0;
    const std::int64_t terms = per_stage_terms * (with_z ? 2 : 1);
    const std::int64_t width = used * (1 + terms), P = stage.stages();
    std::vector<float> mine(std::size_t(width), 0.0f);
    for (std::int64_t m = 0; m < used; ++m) {
      const Micro& u = mb[std::size_t(m)];
      if (last) mine[std::size_t(m)] = u.ce_value;
      std::size_t at = std::size_t(used + m * terms);
      for (float a : u.aux_values) mine[at++] = a;
      for (float z : u.z_values) mine[at++] = z;
    }
    TagScope host(kHostTag);
    const std::vector<float> all = stage.group_->all_gather(from_vector<float>(mine, {width})).to_vector<float>();
    std::vector<double> out, aux_values;  // loss_0.., then aux_0..
    for (std::int64_t m = 0; m < used; ++m) {
      std::vector<Tensor> aux, z;
      for (std::int64_t st = 0; st < P; ++st) {
        std::size_t at = std::size_t(st * width + used + m * terms);
        for (std::int64_t i = 0; i < moe_layers[std::size_t(st)]; ++i) aux.push_back(full({}, double(all[at++])));
        if (with_z)
          for (std::int64_t i = 0; i < moe_layers[std::size_t(st)]; ++i) z.push_back(full({}, double(all[at++])));
      }
      const Tensor ce = full({}, double(all[std::size_t((P - 1) * width + m)]));
      const DecoderModel::Output o = model.combine_loss(ce, aux, z);
      out.push_back(train ? o.loss.item() : o.ce.item());
      aux_values.push_back(o.aux.item());
    }
    out.insert(out.end(), aux_values.begin(), aux_values.end());
    return out;
  }
};

std::vector<double> PipelineStage::forward_backward(const Tensor& batch, std::int64_t M, double seed, bool train,
                                                    StepResult* timing,
                                                    const std::function<void()>& before_last_backward) {
  REMAT_CHECK(batch.dim() == 2 && batch.size(0) % M == 0, ShapeError, "pipeline: a batch of ",
              shape_str(batch.sizes()), " does not split into ", M, " micro-batches");
  Pass pass(*this, batch, M, seed, train, timing);
  // Evaluation: the forward of one micro-batch (the whole batch), no backward.
  const auto ops = train ? pipeline_ops(schedule_, stages(), stage_, M) : std::vector<PipelineOp>{{true, 0}};
  // Random draws keyed by (micro-batch, block), whatever order they run in.
  Generator& gen = default_generator(batch.device());
  const RngState streams = gen.state();
  const std::int64_t units = model_.config().n_layers;
  for (std::size_t k = 0; k < ops.size(); ++k) {
    const PipelineOp& op = ops[k];
    RngStreamScope keyed(gen, streams, op.micro, units);
    const auto op_start = Clock::now();
    const double idle_before = pass.idle;
    if (op.forward)
      pass.forward(op.micro);
    else
      pass.backward(op.micro, k + 1 == ops.size() ? before_last_backward : std::function<void()>());
    if (timing)  // computing time: the op's, less its waits
      (op.forward ? timing->forward_ms : timing->backward_ms) += ms_since(op_start) - (pass.idle - idle_before);
  }
  gen.set_state(rng_streams_end(streams, std::int64_t(train ? M : 1), units));
  pass.drain();
  if (timing) timing->idle_ms = pass.idle;
  return pass.losses(train ? M : 1);
}

PipelineStage::StepResult PipelineStage::step(const Tensor& batch, std::int64_t micro_batches, double seed,
                                              const std::function<void()>& before_last_backward) {
  StepResult r;
  const std::vector<double> v = forward_backward(batch, micro_batches, seed, true, &r, before_last_backward);
  r.loss.assign(v.begin(), v.begin() + micro_batches);
  r.aux.assign(v.begin() + micro_batches, v.end());
  return r;
}

PipelineStageStats PipelineStage::stage_stats(const StepResult& r) const {
  PipelineStageStats mine;
  mine.stage = stage_;
  mine.first_block = bounds_[std::size_t(stage_)];
  mine.end_block = bounds_[std::size_t(stage_ + 1)];
  mine.in_flight = r.peak_in_flight;
  mine.forward_ms = r.forward_ms;
  mine.backward_ms = r.backward_ms;
  mine.idle_ms = r.idle_ms;
  mine.sent_bytes = r.sent_bytes;
  return mine;
}

std::vector<PipelineStageStats> PipelineStage::gather_stats(const PipelineStageStats& mine) {
  // Ten numbers per stage, as the bits of doubles in i64.
  const std::vector<double> v = {double(mine.stage),       double(mine.first_block),          double(mine.end_block),
                                 double(mine.peak_allocated_bytes), double(mine.activation_bytes), double(mine.in_flight),
                                 mine.forward_ms,          mine.backward_ms,                  mine.idle_ms,
                                 double(mine.sent_bytes)};
  std::vector<std::int64_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), v.size() * sizeof(double));
  const auto all = group_->all_gather(from_vector<std::int64_t>(bits, {std::int64_t(bits.size())})).to_vector<std::int64_t>();
  std::vector<PipelineStageStats> out;
  for (std::size_t st = 0; st * v.size() < all.size(); ++st) {
    double x[10];
    std::memcpy(x, all.data() + st * v.size(), sizeof x);
    PipelineStageStats p;
    p.stage = std::int64_t(x[0]);
    p.first_block = std::int64_t(x[1]);
    p.end_block = std::int64_t(x[2]);
    p.peak_allocated_bytes = std::int64_t(x[3]);
    p.activation_bytes = std::int64_t(x[4]);
    p.in_flight = std::int64_t(x[5]);
    p.forward_ms = x[6];
    p.backward_ms = x[7];
    p.idle_ms = x[8];
    p.sent_bytes = std::int64_t(x[9]);
    out.push_back(p);
  }
  return out;
}

double PipelineStage::eval_ce(const Tensor& batch) {
  NoGradGuard ng;
  return forward_backward(batch, 1, 1.0, false, nullptr, {})[0];
}

double PipelineStage::sum_over_stages(const std::vector<double>& partials) {
  // Variable lengths: gather the counts, then the partials as i64 bits padded to the longest.
  const auto counts = group_->all_gather(from_vector<std::int64_t>({std::int64_t(partials.size())}, {1}))
                          .to_vector<std::int64_t>();
  const std::int64_t width = std::max<std::int64_t>(1, *std::max_element(counts.begin(), counts.end()));
  std::vector<std::int64_t> bits(std::size_t(width), 0);
  for (std::size_t i = 0; i < partials.size(); ++i) std::memcpy(&bits[i], &partials[i], sizeof(double));
  const auto all = group_->all_gather(from_vector<std::int64_t>(bits, {width})).to_vector<std::int64_t>();
  double total = 0;
  for (std::size_t st = 0; st < counts.size(); ++st)
    for (std::int64_t i = 0; i < counts[st]; ++i) {
      double x = 0;
      std::memcpy(&x, &all[std::size_t(std::int64_t(st) * width + i)], sizeof(double));
      total += x;
    }
  return total;
}

}  // namespace remat
