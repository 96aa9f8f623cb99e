// PPO's step (training.objective ppo; rollout.h resolve_ppo) as TRL's PPOTrainer runs it: the responses are generated
// with the fp32 scores of every token kept, scored under no_grad by the reference, the value model and the reward
// model, then the policy and the value model train on them together. Sources: docs/research/ppo.md (P below is
// huggingface/trl trl/trainer/ppo_trainer.py at v0.17.0, U its trainer/utils.py; the experimental trainer of v0.26 on
// keeps the same steps).
#include <algorithm>

#include "architecture.h"
#include "checked.h"
#include "step_builder.h"

namespace memsim {

// The value model: the policy's architecture as AutoModelForSequenceClassification (num_labels 1), initialised from
// the reward model in TRL's examples, trained in full by the policy's optimizer (PolicyAndValueWrapper, one
// accelerator.prepare: sharded with it) and never checkpointed (PPOTrainer enables gradient checkpointing on no
// model; a script that does enables it on the policy). Its steps come from a second StepBuilder over a config of that
// model, writing into the policy's program: a first pipeline stage's chunk (its embeddings and every layer, no head),
// whose backward starts from the score head's gradient of the last hidden state. The score head (hidden x 1), the
// final norm and output_hidden_states' tuple of the layers' outputs are left out.
Config value_model_config(const Config& policy) {
  Config v = policy;
  // TRL wraps only the policy with PEFT: the value model trains in full, unquantized. ms-swift prepares it with the
  // policy's train_type (swift/llm/train/rlhf.py _prepare_single_model: self.prepare_model for 'value').
  if (!policy.training.value_model_peft()) v.peft = PeftConfig{};
  v.model.tie_word_embeddings = false;  // a score head, not lm_head: the embedding's gradient is its own
  v.peft.lora_dropout = 0;              // disable_dropout_in_model, as on the policy (StepBuilder::lora_dropout_on)
  auto& t = v.training;
  t.objective = "sft";
  t.reference_model = "auto";
  t.reward_model = "none";
  t.value_model = "full";
  t.num_iterations = 1;
  t.activation_checkpointing = "none";
  t.activation_offload = false;
  t.loss = "auto";
  t.eval_batch_size = 0;
  t.eval_logits_batches = 0;
  t.ema = "none";
  return v;
}

ModelShape value_model_shape(const Config& value) {
  ModelShape shape = model_shape_of(value.model);
  apply_peft(shape, value.peft);
  return shape;
}

StepContext value_model_context(const Config& value, const ModelShape& shape, const StepContext& policy) {
  return StepContext{value, shape, policy.precision, policy.optimizer, policy.gpu, policy.stage, 0, INT64_MAX, true, false};
}

struct StepBuilder::Critic {
  Config config;
  ModelShape shape;
  StepContext ctx;
  std::unique_ptr<StepBuilder> builder;
  std::vector<InFlight> flights;  // the micro-batches whose forward ran and whose backward has not, in order
  size_t next_backward = 0;

  Critic(const Config& policy, const StepContext& p)
      : config(value_model_config(policy)), shape(value_model_shape(config)), ctx(value_model_context(config, shape, p)) {}
};

void StepBuilder::CriticDeleter::operator()(Critic* c) const { delete c; }
StepBuilder::~StepBuilder() = default;

namespace {
// The value model's builder names its tensors and phases "value model: ..." while it writes into the policy's program.
struct ValueModelNames {
  StepProgram& program;
  explicit ValueModelNames(StepProgram& p) : program(p) { program.label_prefix = "value model: "; }
  ~ValueModelNames() { program.label_prefix.clear(); }
  ValueModelNames(const ValueModelNames&) = delete;
  ValueModelNames& operator=(const ValueModelNames&) = delete;
};
}  // namespace

void StepBuilder::critic_setup() {
  const ValueModelNames names(program_);
  critic_.reset(new Critic(cfg_, ctx_));
  critic_->builder = std::make_unique<StepBuilder>(critic_->ctx, &program_);
}

void StepBuilder::ppo_labels() {
  if (ppo_labels_.scores != UINT32_MAX) return;
  auto& p = program_;
  ppo_labels_.scores = p.label("generation scores (output_scores: each token's fp32 scores, then their stack)");
  ppo_labels_.logitss = p.label("logitss: the generation's fp32 scores, padded (kept through the update)");
  ppo_labels_.values = p.label("value or reward head output");
  ppo_labels_.prob_dist = p.label("entropy: softmax of the logits (prob_dist, kept to the next micro-batch)");
  ppo_labels_.entropy = p.label("entropy: logsumexp and prob_dist * logits (transient)");
  ppo_labels_.hidden_fp32 = p.label("hidden states in output (accelerate's fp32 copies, kept to the next micro-batch)");
  ppo_labels_.reference_kv = p.label("reference's KV cache (use_cache: every layer's keys and values, held by its output)");
}

// Its weights (and DDP's bucket: the wrapper is one DDP module), loaded before the trainer wraps both.
void StepBuilder::critic_prologue() {
  const ValueModelNames names(program_);
  critic_->builder->alloc_weights();
  critic_->builder->alloc_grad_bucket();
}

// PolicyAndValueWrapper.forward: critic_backbone(**kwargs) first, then the policy (P:91-94).
void StepBuilder::critic_forward(const std::string& phase) {
  Critic& c = *critic_;
  StepBuilder& b = *c.builder;
  const ValueModelNames names(program_);
  InFlight& f = c.flights.emplace_back();
  f.first = 0, f.end = b.shape_.num_layers, f.pre = true, f.post = false, f.owns_inputs = true;
  b.iter_ = iter_;
  b.mb_in_step_ = mb_in_step_;
  b.dp_grads_.share_step(dp_grads_);  // one DDP over both models (step() sets it for the policy's)
  b.forward_mb(f, phase);
}

// After the policy's backward: the loss reaches the value head through vf_loss, whose nodes were made after the
// policy's forward, but the autograd engine runs the ready node of the highest sequence number first, and every
// node of the policy's graph is younger than the critic's: the policy's backward runs whole, then the critic's.
void StepBuilder::critic_backward(const std::string& phase) {
  Critic& c = *critic_;
  StepBuilder& b = *c.builder;
  const ValueModelNames names(program_);
  b.last_backward_ = last_backward_;
  b.dp_grads_.share_step(dp_grads_);
  b.backward_mb(c.flights[c.next_backward++], phase);
  if (c.next_backward == c.flights.size()) c.flights.clear(), c.next_backward = 0;
}

void StepBuilder::critic_optimizer_step(int iter) {
  const ValueModelNames names(program_);
  critic_->builder->optimizer_step(iter);
}

void StepBuilder::critic_release_grads() {
  const ValueModelNames names(program_);
  critic_->builder->release_grads();
}

// One update's rollout (P:420-490): batch_generation over local_rollout_forward_batch_size queries at a time (U:1367)
// inside unwrap_model_for_generation, which under ZeRO-3 gathers every parameter of the wrapper, the value model's
// with the policy's (trl/models/utils.py GatheredParameters(model.parameters())), until the block ends after pad().
// Each generate() keeps its tokens' scores and its KV cache in the output until it returns, after stacking the scores;
// pad() copies the chunks into one tensor, which replaces the last update's when batch_generation returns. Then, chunk
// by chunk under no_grad, the log-probabilities of those scores, the reference's forward, the value model's and the
// reward model's, each followed by empty_cache().
void StepBuilder::ppo_rollout(const std::string& when) {
  const RolloutFlow& r = resolved_.rollout;
  rollout_labels();
  ppo_labels();
  program_.phase("generation (" + when + ")");
  const ActDims training = dims_;
  const int64_t rows = r.generation_rows, chunk = r.chunk_rows, P = r.prompt_tokens, C = r.completion_tokens;
  const int64_t full = rows / chunk, rest = rows % chunk, chunks = full + (rest > 0 ? 1 : 0);
  const int64_t V = dims_.V;
  uint32_t ids = tmp(mul(8, rows, P + C), rollout_labels_.ids, -1);
  std::vector<uint32_t> whole;
  if (r.gathers_whole_model && unshards_units()) {
    for (int64_t l = -1; l <= shape_.num_layers; ++l) whole.push_back(tmp(gathered_bytes(l), rollout_labels_.gathered, static_cast<int32_t>(l)));
    StepBuilder& v = *critic_->builder;
    for (int64_t l = -1; l < v.shape_.num_layers; ++l)
      whole.push_back(tmp(v.gathered_bytes(l), rollout_labels_.gathered, static_cast<int32_t>(l)));
  }
  // The full chunks before the last one generate as it does, each leaving its stacked scores: one tensor stands for
  // them. The last full chunk's generate, and a shorter one after it, are replayed.
  std::vector<uint32_t> stacked;
  if (full > 1) stacked.push_back(program_.alloc(Component::Generation, mul(4, full - 1, chunk, C, V), ppo_labels_.scores, -1));
  auto generate = [&](int64_t n) {
    GenerateKept kept;
    hf_generate(n, &kept);
    stacked.push_back(program_.alloc(Component::Generation, mul(4, n, C, V), ppo_labels_.scores, -1));  // torch.stack(output.scores, 1)
    for (uint32_t t : kept.scores) drop(t);  // the output goes when generate() returns
    for (uint32_t t : kept.cache) drop(t);
  };
  if (full > 0) generate(chunk);
  if (rest > 0) generate(rest);
  const uint32_t padded = program_.alloc(Component::Generation, mul(4, chunks, chunk, C, V), ppo_labels_.logitss, -1);
  for (uint32_t t : stacked) drop(t);
  for (uint32_t t : logitss_) drop(t);  // the last update's, rebound
  logitss_.assign(1, padded);
  for (uint32_t t : whole) drop(t);
  dims_ = training;
  program_.phase("scoring (" + when + ")");
  const bool value_gathers = unshards_units();  // prepared with the policy: sharded like it
  const bool reward_gathers = r.reward_sharded && unshards_units();
  for (int64_t k = 0; k < std::min<int64_t>(chunks, 2); ++k) {  // the second chunk stands for the rest
    const int64_t n = k + 1 == chunks && rest > 0 ? rest : chunk;
    drop(tmp(mul(4, C, V), rollout_labels_.logps, -1));  // selective_log_softmax of fp32 scores: a row's logsumexp at a time
    program_.empty_cache();
    if (reference_runs()) ppo_score_pass(n, reference_gathers(), true);
    program_.empty_cache();
    ppo_score_pass(n, value_gathers, false);  // get_reward(value_model): its backbone and score head
    ppo_score_pass(n, reward_gathers, false);
  }
  program_.empty_cache();
  dims_ = training;
  rollout_ids_.push_back(ids);
}

// A no-grad forward of `rows` queries with their responses that returns every hidden state (U:1241 forward() and
// get_reward() pass output_hidden_states=True): each layer's input stays with the output until it is deleted. The
// reference's head gives the logits of every position (sliced to the response, divided by the temperature in place,
// then selective_log_softmax); the value and reward models' score head one value per position.
void StepBuilder::ppo_score_pass(int64_t rows, bool gathers, bool logps) {
  const RolloutFlow& r = resolved_.rollout;
  const int32_t post = -1;
  const ActDims before = dims_;
  use_shape({rows, r.prompt_tokens + r.completion_tokens});
  // logps: the reference's pass (its own DeepSpeed engine under ZeRO-3); the value and reward models' otherwise.
  NoGradPass pass = begin_no_grad(gathers ? rollout_labels_.gathered : UINT32_MAX, logps && reference_own_engine());
  std::vector<uint32_t> hidden, norm, cache;
  // The reference's DynamicCache (RolloutFlow::reference_kv_cache): each layer's keys and values stay with the output
  // where the layer would otherwise have freed them.
  const std::function<void(int64_t)> keep = [&](int64_t l) {
    for (int kv = 0; kv < 2; ++kv)
      cache.push_back(program_.alloc(Component::Activations, mul(dims_.b, dims_.s, kv_cache_width(kv), dims_.e),
                                     ppo_labels_.reference_kv, static_cast<int32_t>(l)));
  };
  uint32_t g = no_grad_trunk(pass, &hidden, norm, logps && r.reference_kv_cache ? &keep : nullptr);
  if (!logps) {
    drop(tmp(mul(dims_.e, dims_.T), ppo_labels_.values, post));
  } else {
    const int64_t e = dims_.e, el = resolved_.preference.reference_logits_fp32 ? 4 : e;
    const int64_t all = mul(dims_.T, dims_.V), row = mul(r.completion_tokens, dims_.V);
    uint32_t hd = head_dequant();
    uint32_t lg16 = el != e ? tmp(mul(e, all), rollout_labels_.score_logits, post) : UINT32_MAX;
    drop_if(hd);
    uint32_t logits = tmp(mul(el, all), rollout_labels_.score_logits, post);
    if (pass.own_engine) {  // its own DeepSpeed engine frees lm_head's parameters after lm_head (release_sub_module)
      release_head_gathered(pass, g);
      g = UINT32_MAX;
    }
    drop_if(lg16);
    drop(tmp(mul(el, row), rollout_labels_.logps, post));  // a row's logsumexp (fp32) or log_softmax (16-bit)
    drop(logits);  // del ref_output, ref_logits
  }
  for (uint32_t t : norm) drop(t);
  release_head_gathered(pass, g);
  for (uint32_t t : hidden) drop(t);
  for (uint32_t t : cache) drop(t);
  end_no_grad(pass);
  dims_ = before;
}

// The training forward's `output` (and `logits`, a view of it) lives until the next micro-batch's forward returns and
// rebinds them (the loop deletes them only after the mini-batch, P:606-614): the previous micro-batch's go as soon as
// this one's logits exist.
void StepBuilder::ppo_hold_outputs(uint32_t logits) {
  ppo_labels();
  hold(logits, ppo_outputs_);
  if (ppo_hidden_states_fp32())  // accelerate's convert_outputs_to_fp32 of the hidden-state tuple
    for (int64_t l = 0; l <= shape_.num_layers; ++l)
      hold(program_.alloc(Component::Activations, mul(4, dims_.Tn, dims_.h), ppo_labels_.hidden_fp32, -1), ppo_outputs_);
  ppo_logits_ = logits;
  release_graph(ppo_prev_outputs_);
}

// After the micro-batch's backward (and, at the end of a mini-batch, after optimizer.step() and zero_grad()), under
// no_grad (P:589-591): prob_dist = softmax(logits), entropy = logsumexp(logits) - sum(prob_dist * logits), over the
// response's positions in the logits' dtype. prob_dist replaces the previous micro-batch's.
void StepBuilder::ppo_entropy() {
  if (ppo_logits_ == UINT32_MAX) return;
  ppo_labels();
  const int32_t post = -1;
  const GrpoLogits g = grpo_logits();
  const uint32_t prob = program_.alloc(Component::Activations, mul(g.el, g.scored), ppo_labels_.prob_dist, post);
  if (ppo_prob_dist_ != UINT32_MAX) drop(ppo_prob_dist_);  // the name rebinds: the last micro-batch's goes
  ppo_prob_dist_ = prob;
  drop(tmp(mul(g.el, g.scored), ppo_labels_.entropy, post));  // logsumexp: (x - max).exp()
  drop(tmp(mul(g.el, g.scored), ppo_labels_.entropy, post));  // prob_dist * logits
  ppo_logits_ = UINT32_MAX;
  release_graph(ppo_prev_outputs_);
  ppo_prev_outputs_.swap(ppo_outputs_);
}

// The mini-batch's last micro-batch: its entropy after the optimizer step, then `del output, logits, prob_dist, ...`
// and torch.cuda.empty_cache() (P:606-615).
void StepBuilder::ppo_end_of_minibatch() {
  ppo_entropy();
  release_graph(ppo_prev_outputs_);
  if (ppo_prob_dist_ != UINT32_MAX) drop(ppo_prob_dist_), ppo_prob_dist_ = UINT32_MAX;
  program_.empty_cache();
}

}  // namespace memsim
