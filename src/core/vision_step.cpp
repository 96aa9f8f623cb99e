// A vision-language model (ModelConfig::vision_tower), LLaVA's layout first: the frozen vision tower runs on the
// micro-batch's images, the projector maps its patch features to the decoder's width, and the features replace the
// image tokens' rows of the input embeddings. As transformers' LlavaModel runs it (models/llava/modeling_llava.py,
// v4.46-4.57: get_image_features and forward; haotian-liu/LLaVA llava_arch.py and clip_encoder.py do the same with
// the tower under @torch.no_grad()):
// - the decoder's embed_tokens runs first (inputs_embeds);
// - vision_tower(pixel_values, output_hidden_states=True): the tower's program under no_grad (its weights are frozen
//   and the pixels need no gradient, so autograd records nothing), keeping every hidden state (the embeddings' and
//   each block's output, 25 for CLIP ViT-L) in the output until get_image_features returns. The comment there: "this
//   is not memory efficient at all (output_hidden_states=True) will save all the hidden states";
// - hidden_states[vision_feature_layer = -2][:, 1:] (the 'default' strategy drops the class token): a view of the
//   second-to-last block's output, which the projector's first linear saves, so that output stays until backward;
// - multi_modal_projector: linear_1, GELU, linear_2 (LLaVA's mlp2x_gelu; projector_depth linears with GELU
//   between); where it trains (training.train_projector), each linear saves its input for its weight's gradient
//   and GELU saves its input, and where it is frozen nothing of it is kept;
// - inputs_embeds.masked_scatter(special_image_mask, image_features): a new [batch, sequence, hidden] tensor, the
//   decoder's first residual. Its backward reads only the mask (masked_select of the gradient for the features,
//   masked_fill for the embeddings), so neither input is kept.
// Backward, after the decoder's first layer: masked_select gives the features' gradient, and the projector's
// backward runs down to linear_1, whose input needs no gradient unless the tower trains
// (training.train_vision_tower). A trained tower runs its forward with grad (each block checkpointed where the
// decoder's activation checkpointing is on: gradient_checkpointing_enable reaches CLIPEncoder too), and its backward
// after the projector's: the slice's gradient into zeros of the selected hidden state, then the blocks below it, last
// first. The last block's output feeds nothing of the loss, so its backward never runs and what it saved goes with
// the hidden-states tuple.
// Qwen2-VL and Qwen2.5-VL (a program whose "vision_tower" object says so, TowerSpec; docs/research/qwen2-vl.md) differ
// where their spec does: the tower keeps only its running hidden state (no output_hidden_states), the features are
// the last block's output whole, and the projector is the tower's PatchMerger (ln_q, 2 x 2 rows side by side, Linear,
// GELU, Linear; Qwen2.5-VL's ln_q an RMSNorm and its output gathered back from window order). ms-swift's
// vit_gradient_checkpointing (training.vit_gradient_checkpointing) runs a frozen tower with grad, checkpointed.
// Not modelled: the tower's weights cast by autocast under an fp32 recipe (LLaVA casts the tower to the compute
// dtype), the 2 bytes of pixel values under DeepSpeed (the HF Trainer casts floating inputs to its dtype; memsim
// keeps the image processor's fp32), and LLaVA's own repository splicing per sample with torch.cat and re-padding
// (prepare_inputs_labels_for_multimodal: a few [batch, sequence, hidden] copies while it runs).
#include <algorithm>

#include "checked.h"
#include "step_builder.h"

namespace memsim {

uint32_t StepBuilder::vision_forward(InFlight& f, uint32_t embeds) {
  const int64_t images = cfg_.data.images_per_sample;
  if (!shape_.vision_tower || images == 0) return embeds;  // a text-only batch: the tower does not run
  if (!vision_labels_.made) {
    auto& l = vision_labels_;
    l.made = true;
    l.pixels = program_.label("pixel values (the batch's images, fp32)");
    l.projector_out = program_.label("projector linear output (saved by GELU)");
    l.projector_gelu = program_.label("projector GELU output (saved by the next linear)");
    l.features = program_.label("image features (the projector's output)");
    l.mask = program_.label("image token mask (saved by masked_scatter)");
    l.spliced = program_.label("input embeddings with the image features (masked_scatter)");
    l.scatter_tmp = program_.label("masked_scatter / masked_select scratch (mask copy, prefix sum, indices)");
    l.grad_features = program_.label("gradient of the image features (masked_select)");
    l.grad_selected = program_.label("gradient of the tower's selected hidden state (slice backward)");
    l.grad_projector = program_.label("projector backward: activation gradients");
    l.merger_norm = program_.label("patch merger LayerNorm output (ln_q; merged rows are a view of it)");
    l.merger_stats = program_.label("patch merger LayerNorm mean and rstd (fp32, saved)");
  }
  const Architecture& tower = *shape_.vision_tower;
  const TowerSpec spec = tower_spec(tower);
  const bool merger = spec.projector == TowerSpec::Projector::PatchMerger;
  const int64_t n_images = mul(dims_.b, images);
  // LLaVA-NeXT: each image is `crops` tower images (its base view and tiles).
  const int64_t crops = shape_.image_crops;
  // The image processor's pixel_values, collated into the batch the loop holds until the micro-batch's backward.
  int64_t pixel_bytes = 0;
  for (const auto& t : tower.inputs) pixel_bytes = add(pixel_bytes, mul(4, t.numel()));
  f.pixels = act(mul(n_images, crops, pixel_bytes), vision_labels_.pixels, -1);
  // LlavaNextModel.get_image_features: pixel_values [batch, crops, ...] becomes torch.cat of each image's crops, a copy
  // the tower reads, alive until it returns.
  const uint32_t crops_copy = crops > 1 ? tmp(mul(n_images, crops, pixel_bytes), vision_labels_.pixels, -1) : UINT32_MAX;

  // The tower: its program's stages, one image per sample of the program; under no_grad unless it trains.
  const ActDims decoder_dims = dims_;
  const bool was_no_grad = no_grad_;
  // ms-swift's vit_gradient_checkpointing (training.vit_gradient_checkpointing true): the blocks checkpointed, and a
  // frozen tower's patch_embed output made to require grad (enable_input_require_grads on the tower), so a graph runs
  // through it even with every weight frozen (swift/trainers/mixin.py _prepare_gradient_checkpointing, ms-swift 3.5+).
  const TriState vit_gc = cfg_.training.vit_checkpointing();
  const bool input_grads = vit_gc == TriState::True;
  const bool tower_grad = !was_no_grad && (tower_trains() || input_grads);
  const bool tower_ckpt = tower_grad && (vit_gc == TriState::True || (vit_gc == TriState::Auto && resolved_.checkpointing != Checkpointing::None));
  dims_.b = mul(n_images, crops);
  no_grad_ = !tower_grad;
  f.tower_ckpt = tower_ckpt;
  in_tower_ = true;
  SavedLayer none;
  std::vector<uint32_t>& hidden = f.tower_hidden;  // BaseModelOutput.hidden_states: the embeddings', then each block's
  hidden.clear();
  f.tower_pre = {};
  f.tower_saved.assign(static_cast<size_t>(tower.repeat), SavedLayer{});
  f.tower_req.assign(static_cast<size_t>(tower.repeat), false);
  f.tower_bytes.assign(static_cast<size_t>(tower.repeat), 0);
  hidden.push_back(program_forward(ProgramStage::Embeddings, -1, UINT32_MAX, false, 0, tower_grad ? f.tower_pre : none, false, f.pixels));
  const ProgramPlan emb = plan_program(ProgramStage::Embeddings, -1, false, 0);
  bool req = emb.req[static_cast<size_t>(tower.embeddings.output)] || (tower_grad && input_grads);
  int64_t bytes = emb.bytes[static_cast<size_t>(tower.embeddings.output)];
  for (int64_t l = 0; l < tower.repeat; ++l) {
    const int32_t li = static_cast<int32_t>(l);
    const size_t i = static_cast<size_t>(l);
    f.tower_req[i] = req, f.tower_bytes[i] = bytes;
    // The block's input is the caller's (the hidden-states tuple holds it); a checkpoint keeps it for the recompute.
    if (tower_ckpt) no_grad_ = true;
    hidden.push_back(program_forward(ProgramStage::Block, li, hidden.back(), req, bytes, tower_grad && !tower_ckpt ? f.tower_saved[i] : none,
                                     false, UINT32_MAX));
    if (tower_ckpt) no_grad_ = false;
    // Without output_hidden_states (Qwen2-VL's blocks loop), a frozen tower's block input goes once the block ran.
    if (!spec.all_hidden_states && !tower_grad) drop(hidden[hidden.size() - 2]), hidden[hidden.size() - 2] = UINT32_MAX;
    const ProgramPlan blk = plan_program(ProgramStage::Block, li, req, bytes);
    req = blk.req[static_cast<size_t>(tower.block_of(l).output)];
    bytes = blk.bytes[static_cast<size_t>(tower.block_of(l).output)];
  }
  in_tower_ = false;
  no_grad_ = was_no_grad;
  dims_ = decoder_dims;
  if (crops_copy != UINT32_MAX) drop(crops_copy);

  // vision_feature_layer -2: a view of its patch rows (-1, Qwen2-VL: the last block's output, whole). The projector
  // saves what its backward reads: each linear its input where its weight trains (the first one's is the view, whose
  // base stays), each GELU its input where a gradient flows through it (a trained projector, or a trained tower below
  // it).
  const uint32_t selected = spec.feature_layer == -2 && hidden.size() >= 2 ? hidden[hidden.size() - 2] : hidden.back();
  bool weights = false;
  for (const auto& t : shape_.pre) weights |= t.part == ParamTensor::Part::Projector && has_grad(t);
  weights = weights && !no_grad_;
  const bool flows = !no_grad_ && (weights || tower_grad);
  const int64_t rows = mul(n_images, shape_.projector_rows);  // every crop's features
  const auto& widths = shape_.projector_widths;
  const size_t depth = widths.size() - 1;
  f.projector_inputs.assign(depth, UINT32_MAX);
  f.gelu_inputs.assign(depth > 0 ? depth - 1 : 0, UINT32_MAX);
  // A patch merger first normalises the patch rows (ln_q), then reads each image token's merge rows side by side, a
  // view of the norm's output: .view(-1, hidden_size x merge). LayerNorm saves its input and fp32 mean and rstd per
  // row where a gradient flows through it (native_layer_norm).
  // Qwen2.5-VL's ln_q is transformers' eager RMSNorm instead: x32 = x.float() and rstd, saved by pow and the product
  // where x needs a gradient (a trained tower); the product cast back, which weight * (...) saves where the weight
  // trains.
  uint32_t normed = UINT32_MAX;
  f.merger_norm = merger && flows;
  f.merger_saved.clear();
  if (merger) {
    const int64_t elements = mul(rows, widths[0]), patch_rows = mul(rows, spec.merge);
    auto make = [&](int64_t bytes, uint32_t label, bool saved) { return saved ? act(bytes, label, -1) : tmp(bytes, label, -1); };
    if (!spec.rms_merger) {
      normed = act(mul(dims_.e, elements), vision_labels_.merger_norm, -1);
      if (flows) {
        if (!tower_grad) {
          program_.recategorize(selected, Component::Activations);
          f.merger_saved.push_back(selected);
        }
        f.merger_saved.push_back(act(mul(8, patch_rows), vision_labels_.merger_stats, -1));
      }
    } else {
      const uint32_t x32 = make(mul(4, elements), vision_labels_.merger_stats, tower_grad);
      const uint32_t rstd = make(mul(4, patch_rows), vision_labels_.merger_stats, tower_grad);
      const uint32_t prod = tmp(mul(4, elements), vision_labels_.merger_stats, -1);
      const uint32_t cast = make(mul(dims_.e, elements), vision_labels_.merger_norm, weights);
      drop(prod);
      normed = act(mul(dims_.e, elements), vision_labels_.merger_norm, -1);
      for (uint32_t t : {x32, rstd})
        if (tower_grad) f.merger_saved.push_back(t);
        else drop(t);
      if (weights) f.merger_saved.push_back(cast);
      else drop(cast);
    }
  }
  if (weights) {
    if (!tower_grad && !merger) program_.recategorize(selected, Component::Activations);
    f.projector_inputs[0] = merger ? normed : selected;
  }
  uint32_t x = UINT32_MAX;  // the running projector tensor (UINT32_MAX: the selected view)
  for (size_t i = 0; i < depth; ++i) {
    const int64_t out = widths[i + 1];
    if (i > 0) {  // GELU between linears, then linear i + 1 reads its output
      const uint32_t g = act(mul(dims_.e, rows, widths[i]), vision_labels_.projector_gelu, -1);  // of linear i's output
      if (flows) f.gelu_inputs[i - 1] = x;
      else drop(x);
      x = g;
      if (weights) f.projector_inputs[i] = x;
    }
    const uint32_t y = act(mul(dims_.e, rows, out), i + 1 < depth ? vision_labels_.projector_out : vision_labels_.features, -1);
    if (i > 0 && !weights) drop(x);
    if (i == 0 && merger && !weights) drop(normed);
    x = y;
  }
  // LLaVA-NeXT's pack_image_features, one image at a time: the tiles' features viewed as a grid, permute(...)
  // .contiguous() (a copy), unpadded to the image's aspect (a view), torch.cat with image_newline expanded at the end
  // of each row (new), flattened and torch.cat after the base view's features (new, kept in a list); then torch.cat of
  // the list, the image features. cat and permute keep nothing for backward.
  if (spec.newline) {
    const int64_t width = widths[depth], tokens = shape_.image_tokens, base = spec.feature_rows;
    const int64_t tiles = sub(shape_.projector_rows, base);
    const uint32_t listed = tmp(mul(dims_.e, n_images, tokens, width), vision_labels_.features, -1);
    const uint32_t grid = tmp(mul(dims_.e, tiles, width), vision_labels_.scatter_tmp, -1);
    const uint32_t with_newline = tmp(mul(dims_.e, sub(tokens, base), width), vision_labels_.scatter_tmp, -1);
    drop(grid), drop(with_newline);
    const uint32_t packed = act(mul(dims_.e, n_images, tokens, width), vision_labels_.features, -1);
    drop(listed), drop(x);
    x = packed;
  }
  // Qwen2.5-VL ran its blocks in window order: hidden_states[reverse_indices] gathers the merged rows back, a copy
  // (index's backward needs only the indices).
  if (spec.reordered) {
    const uint32_t y = act(program_.tensors[x].bytes, vision_labels_.features, -1);
    drop(x);
    x = y;
  }
  // get_image_features returns: the hidden-states tuple goes. A frozen tower's states all go but the one linear_1
  // saved; a trained tower's block inputs stay for its backward, and its last block, whose output feeds nothing,
  // lets go of what it saved.
  if (!tower_grad) {
    const bool keep_selected = (weights && !merger) ||  // linear_1's input, or the LayerNorm merger's
                               std::find(f.merger_saved.begin(), f.merger_saved.end(), selected) != f.merger_saved.end();
    for (uint32_t h : hidden)
      if (h != UINT32_MAX && (!keep_selected || h != selected)) drop(h);
    hidden.clear();
  } else if (spec.feature_layer == -2) {
    drop(hidden.back());
    hidden.pop_back();
    // The selected state: linear_1 keeps it where its weight trains; else nothing does (its block's backward does
    // not read its output), and it goes.
    f.tower_selected_bytes = program_.tensors[selected].bytes;
    if (!weights) drop(selected), hidden.back() = UINT32_MAX;
    SavedLayer& last = f.tower_saved.back();
    std::sort(last.attn.begin(), last.attn.end());
    last.attn.erase(std::unique(last.attn.begin(), last.attn.end()), last.attn.end());
    for (uint32_t t : last.attn) drop(t);
    last = {};
  } else {
    // The last block's output is the features' source (a merger's LayerNorm saves it; an RMSNorm its fp32 copy, so
    // the output itself goes): every block's backward runs.
    if (spec.rms_merger) drop(selected), hidden.back() = UINT32_MAX;
  }

  // masked_scatter: a new embeddings tensor; its backward keeps the image-token mask ([batch, sequence, 1] bools).
  // masked_scatter is clone() then masked_scatter_, which on CUDA makes the expanded mask contiguous (a bool per
  // element) and an int64 prefix sum of self's size (aten/src/ATen/native/cuda/IndexKernel.cu masked_scatter__cuda:
  // maskPrefixSum = at::empty(self.sizes(), kLong)): 9 bytes per element of the embeddings while it runs.
  const uint32_t mask = act(dims_.T, vision_labels_.mask, -1);
  const uint32_t spliced = act(mul(dims_.e_res, dims_.Tn, dims_.h), vision_labels_.spliced, -1);
  const uint32_t mask_cont = tmp(mul(dims_.T, dims_.h), vision_labels_.scatter_tmp, -1);
  const uint32_t prefix_sum = tmp(mul(8, dims_.T, dims_.h), vision_labels_.scatter_tmp, -1);
  drop(prefix_sum), drop(mask_cont);
  if (flows) f.image_mask = mask;
  else drop(mask);
  drop(x);
  if (std::find(embed_saved_.begin(), embed_saved_.end(), embeds) == embed_saved_.end()) drop(embeds);
  return spliced;
}

// After the decoder's first layer: `dres`, the gradient of the spliced embeddings, stands for masked_fill's (the
// embeddings' gradient, the same size); masked_select takes the image rows for the features. Then the projector's
// backward, last linear first, and a trained tower's. The projector's and the tower's .grad tensors are the
// embeddings slot's (alloc_layer_grads(-1)).
void StepBuilder::vision_backward(InFlight& f) {
  if (f.image_mask == UINT32_MAX) return;  // nothing of the image path needs a gradient
  const int64_t n_images = mul(dims_.b, cfg_.data.images_per_sample);
  const int64_t rows = mul(n_images, shape_.projector_rows), token_rows = mul(n_images, shape_.image_tokens);
  const auto& widths = shape_.projector_widths;
  const size_t depth = widths.size() - 1;
  const bool tower_grad = !f.tower_hidden.empty();
  // masked_scatter's backward for the features is masked_select(grad, mask): on CUDA index_out over the mask
  // expanded to the gradient's [batch, sequence, hidden], whose nonzero() is an int64 [N, 3] index tensor for the N
  // selected elements while the result is written.
  const uint32_t indices = tmp(mul(24, token_rows, widths[depth]), vision_labels_.scatter_tmp, -1);
  uint32_t g = tmp(mul(dims_.e_res, token_rows, widths[depth]), vision_labels_.grad_features, -1);
  drop(indices);
  // LLaVA-NeXT: the packing's backward gives the projector output's gradient, every crop's rows (the unpadded
  // region's gradient into zeros of the tiles' grid, permuted back), beside the features' gradient.
  if (token_rows != rows || shape_.image_crops > 1) {
    const uint32_t unpacked = tmp(mul(dims_.e_res, rows, widths[depth]), vision_labels_.grad_features, -1);
    drop(g);
    g = unpacked;
  }
  const bool merger = tower_spec(*shape_.vision_tower).projector == TowerSpec::Projector::PatchMerger;
  for (size_t i = depth; i-- > 0;) {
    // Linear i + 1: its weight's gradient from g and its saved input; its input's, where one is needed.
    // (the first one's also where a merger's norm trains: its weight's gradient reads the norm output's gradient)
    const bool dx_needed = i > 0 || tower_grad || f.merger_norm;
    const uint32_t dx = dx_needed ? tmp(mul(dims_.e, rows, widths[i]), vision_labels_.grad_projector, -1) : UINT32_MAX;
    drop(g);
    const uint32_t input = f.projector_inputs[i];
    // A trained tower's hidden state is its own (a merger's linear reads the norm's output instead).
    if (input != UINT32_MAX && !(i == 0 && tower_grad && !merger)) drop(input);
    g = dx;
    if (i > 0) {  // GELU's backward over its saved input
      const uint32_t dg = tmp(mul(dims_.e, rows, widths[i]), vision_labels_.grad_projector, -1);
      drop(g);
      drop(f.gelu_inputs[i - 1]);
      g = dg;
    }
  }
  // A patch merger's norm: its weights' gradients, its input's where the tower trains; what it saved goes (a trained
  // tower's hidden state is its own).
  if (f.merger_norm) {
    if (tower_grad) {
      const uint32_t dn = tmp(mul(dims_.e, rows, widths[0]), vision_labels_.grad_projector, -1);
      drop(g);
      g = dn;
    } else {
      drop(g);
      g = UINT32_MAX;
    }
    for (uint32_t t : f.merger_saved) drop(t);
    f.merger_saved.clear();
    f.merger_norm = false;
  }
  drop(f.image_mask);
  f.image_mask = UINT32_MAX;
  f.projector_inputs.clear(), f.gelu_inputs.clear();
  if (tower_grad) tower_backward(f, g);
}

void StepBuilder::tower_backward(InFlight& f, uint32_t features_grad) {
  const ActDims decoder_dims = dims_;
  dims_.b = mul(dims_.b, cfg_.data.images_per_sample, shape_.image_crops);
  in_tower_ = true;
  std::vector<uint32_t>& hidden = f.tower_hidden;  // block l's input at l; the selected state last
  // [:, 1:]'s backward: the patch rows' gradient into zeros of the whole hidden state (slice_backward); where the
  // features are the whole state (Qwen2-VL), the gradient is it. The selected state itself is read by nothing from
  // here on (its block's backward needs its input, not its output).
  const int64_t last = static_cast<int64_t>(hidden.size()) - 1;  // the selected state: block last - 1's output
  const TowerSpec spec = tower_spec(*shape_.vision_tower);
  uint32_t g = features_grad;
  if (spec.feature_layer == -2) {
    g = tmp(f.tower_selected_bytes, vision_labels_.grad_selected, -1);
    drop(features_grad);
  }
  if (hidden.back() != UINT32_MAX) drop(hidden.back());
  const bool ckpt = f.tower_ckpt;
  for (int64_t l = last - 1; l >= 0; --l) {
    const int32_t li = static_cast<int32_t>(l);
    const size_t i = static_cast<size_t>(l);
    if (ckpt) {
      SavedLayer& re = recompute_;
      re.attn.clear(), re.mlp.clear(), re.ops.clear();
      const uint32_t out = program_forward(ProgramStage::Block, li, hidden[i], f.tower_req[i], f.tower_bytes[i], re, false, UINT32_MAX);
      const bool reentrant = resolved_.checkpoint_reentrant, own_out = recomputed_output_owned(out, hidden[i]);
      if (!reentrant && own_out) drop(out);
      g = program_backward(ProgramStage::Block, li, g, f.tower_req[i], f.tower_bytes[i], re);
      if (reentrant && own_out) drop(out);
    } else {
      g = program_backward(ProgramStage::Block, li, g, f.tower_req[i], f.tower_bytes[i], f.tower_saved[i]);
    }
    drop(hidden[i]);  // block l's input: its backward was its last reader
  }
  const uint32_t d = program_backward(ProgramStage::Embeddings, -1, g, false, 0, f.tower_pre);
  if (d != UINT32_MAX) drop(d);
  hidden.clear();
  f.tower_saved.clear();
  in_tower_ = false;
  dims_ = decoder_dims;
}

}  // namespace memsim
