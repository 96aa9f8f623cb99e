// An evaluation between training steps (training.eval_batch_size): the HF Trainer's evaluate() with
// eval_strategy "steps" or "epoch" (trainer.py evaluation_loop: model.eval(), then prediction_step under
// torch.no_grad() for each batch of per_device_eval_batch_size), litgpt's validate() and torchtune's validation loop.
// The model runs as a no-grad forward: nothing is saved for backward and gradient checkpointing does not apply
// (transformers checkpoints only `if self.gradient_checkpointing and self.training`), so each layer's intermediates
// go as soon as their readers have run, while the loss makes the whole batch's logits and the loss path's fp32
// copies of them exist at once. An eval batch above the training micro-batch, under checkpointing, can set the
// run's peak. memsim runs one evaluation after the first optimizer step, so that the steps after it start from the
// allocator cache it leaves (the Trainer calls no empty_cache around evaluate()).
#include "checked.h"
#include "step_builder.h"

namespace memsim {

// One eval batch: the forward and the loss, as the training forward computes them (loss_forward, under no_grad_ its
// saved tensors are temporaries, dropped when the loss is done). The logits the model returns stay with
// prediction_step's outputs; the HF Trainer's loop then keeps them when compute_metrics needs them
// (eval_logits_batches): accelerator.gather_for_metrics concatenates every data-parallel rank's batch into a new
// tensor, and EvalLoopContainer.add concatenates that to what the earlier batches left (nested_concat: torch.cat,
// a new tensor each time), both alive until the old ones go. The earlier batches' logits are one tensor of their
// sum, so the simulation runs one forward however many batches accumulate: the last, where the most is held.
void StepBuilder::evaluation(int after_step) {
  const auto& t = cfg_.training;
  program_.phase("evaluation (after step " + std::to_string(after_step) + ")");
  if (eval_logits_label_ == UINT32_MAX) {
    eval_logits_label_ = program_.label("evaluation logits kept for compute_metrics (gathered, concatenated)");
    eval_gathered_label_ = program_.label("evaluation forward: layer's gathered parameters");
  }
  const ActDims train_dims = dims_;
  use_shape({t.eval_batch_size, t.sequence_length});
  // The training loop's own outputs are untouched by evaluate(): set aside what the loss path would release.
  const uint32_t held_before = held_logits_, prev_before = prev_logits_;
  held_logits_ = prev_logits_ = UINT32_MAX;
  std::vector<uint32_t> prev_graph;
  prev_graph.swap(prev_graph_attrs_);

  // Liger's patched forward skips the logits only `self.training and labels is not None` (liger_kernel
  // transformers/model/llama.py lce_forward): in eval mode it makes them and calls transformers' own loss.
  const LossImpl train_loss = resolved_.loss;
  if (train_loss == LossImpl::FusedLinear && resolved_.framework->transformers_model)
    resolved_.loss = transformers_loss(resolved_.versions);
  const int64_t dp = cfg_.parallel.data_parallel_size;
  const int64_t logits_bytes = mul(resolved_.loss == LossImpl::HfFp32Logits ? 4 : dims_.e, dims_.T, dims_.V);
  const int64_t kept = t.eval_logits_batches;
  // What the earlier batches left: (kept - 1) batches gathered from every rank.
  const uint32_t earlier = kept > 1 ? tmp(mul(kept - 1, dp, logits_bytes), eval_logits_label_, -1) : UINT32_MAX;

  NoGradPass pass = begin_no_grad(unshards_units() ? eval_gathered_label_ : UINT32_MAX);
  uint32_t res = no_grad_layers(pass, nullptr, nullptr);
  const uint32_t head = no_grad_gathered(pass, shape_.num_layers);
  std::vector<uint32_t> saved;
  loss_forward(res, saved);
  drop_if(head);
  for (uint32_t s : saved) drop(s);
  drop_if(held_logits_);  // a loop that holds the outputs lets go of them with the batch
  held_logits_ = UINT32_MAX;
  end_no_grad(pass);
  if (kept > 0) {
    // The outputs' logits (the loss path freed its own reference: the same block comes back), the gather across
    // ranks, the concatenation; then the batch's and the gathered copies go, and finally the whole to the host.
    const uint32_t logits = tmp(logits_bytes, labels_.logits, -1);
    const uint32_t gathered = dp > 1 ? tmp(mul(dp, logits_bytes), eval_logits_label_, -1) : UINT32_MAX;
    const uint32_t all = tmp(mul(kept, dp, logits_bytes), eval_logits_label_, -1);
    drop_if(earlier);
    drop_if(gathered);
    drop(logits);
    drop(all);  // eval_accumulation_steps reached, or the evaluation's end: to the host
  }

  resolved_.loss = train_loss;
  held_logits_ = held_before, prev_logits_ = prev_before;
  prev_graph_attrs_.swap(prev_graph);
  dims_ = train_dims;
}

}  // namespace memsim
