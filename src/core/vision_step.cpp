// A vision-language model in LLaVA's layout (ModelConfig::vision_tower): the frozen vision tower runs on the
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
// backward runs down to linear_1, whose input needs no gradient. The tower has no backward.
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
    l.grad_features = program_.label("gradient of the image features (masked_select)");
    l.grad_projector = program_.label("projector backward: activation gradients");
  }
  const Architecture& tower = *shape_.vision_tower;
  const int64_t n_images = mul(dims_.b, images);
  // The image processor's pixel_values, collated into the batch the loop holds until the micro-batch's backward.
  int64_t pixel_bytes = 0;
  for (const auto& t : tower.inputs) pixel_bytes = add(pixel_bytes, mul(4, t.numel()));
  f.pixels = act(mul(n_images, pixel_bytes), vision_labels_.pixels, -1);

  // The tower: its program's stages under no_grad, one image per sample of the program.
  const ActDims decoder_dims = dims_;
  const bool was_no_grad = no_grad_;
  dims_.b = n_images;
  no_grad_ = true;
  in_tower_ = true;
  SavedLayer none;
  std::vector<uint32_t> hidden;  // BaseModelOutput.hidden_states: the embeddings' output, then each block's
  hidden.push_back(program_forward(ProgramStage::Embeddings, -1, UINT32_MAX, false, 0, none, false, f.pixels));
  int64_t bytes = plan_program(ProgramStage::Embeddings, -1, false, 0).bytes[static_cast<size_t>(tower.embeddings.output)];
  for (int64_t l = 0; l < tower.repeat; ++l) {
    const int32_t li = static_cast<int32_t>(l);
    hidden.push_back(program_forward(ProgramStage::Block, li, hidden.back(), false, bytes, none, false, UINT32_MAX));
    bytes = plan_program(ProgramStage::Block, li, false, bytes).bytes[static_cast<size_t>(tower.block_of(l).output)];
  }
  in_tower_ = false;
  no_grad_ = was_no_grad;
  dims_ = decoder_dims;

  // vision_feature_layer -2; its patch rows are a view, which linear_1 saves (its weight trains).
  const uint32_t selected = hidden.size() >= 2 ? hidden[hidden.size() - 2] : hidden.back();
  // A frozen projector (training.train_projector) reads tensors that need no gradient: nothing is saved.
  bool trains = false;
  for (const auto& t : shape_.pre) trains |= t.part == ParamTensor::Part::Projector && has_grad(t);
  const bool grad = !no_grad_ && trains;
  if (grad) {
    program_.recategorize(selected, Component::Activations);
    f.vision_saved.push_back(selected);
  }
  const int64_t rows = mul(n_images, shape_.image_tokens);
  const auto& widths = shape_.projector_widths;
  const size_t depth = widths.size() - 1;
  uint32_t x = UINT32_MAX;  // the running projector tensor (UINT32_MAX: the selected view)
  for (size_t i = 0; i < depth; ++i) {
    const int64_t out = widths[i + 1];
    if (i > 0) {  // GELU between linears: saves its input (the previous linear's output)
      const uint32_t g = act(mul(dims_.e, rows, out), vision_labels_.projector_gelu, -1);
      if (grad) f.vision_saved.push_back(x);
      else drop(x);
      x = g;
    }
    const uint32_t y = act(mul(dims_.e, rows, out), i + 1 < depth ? vision_labels_.projector_out : vision_labels_.features, -1);
    if (i > 0) {  // this linear saves its input (the GELU output)
      if (grad) f.vision_saved.push_back(x);
      else drop(x);
    }
    x = y;
  }
  // get_image_features returns: the hidden-states tuple goes, but for the view linear_1 saved.
  for (uint32_t h : hidden)
    if (!grad || h != selected) drop(h);

  // masked_scatter: a new embeddings tensor; its backward keeps the image-token mask ([batch, sequence, 1] bools).
  const uint32_t mask = act(dims_.T, vision_labels_.mask, -1);
  const uint32_t spliced = act(mul(dims_.e_res, dims_.Tn, dims_.h), vision_labels_.spliced, -1);
  if (grad) f.vision_saved.push_back(mask);
  else drop(mask);
  drop(x);
  if (std::find(embed_saved_.begin(), embed_saved_.end(), embeds) == embed_saved_.end()) drop(embeds);
  return spliced;
}

// After the decoder's first layer: `dres`, the gradient of the spliced embeddings, stands for masked_fill's (the
// embeddings' gradient, the same size); masked_select takes the image rows for the features. Then the projector's
// backward, last linear first. The projector's .grad tensors are the embeddings slot's (alloc_layer_grads(-1)).
void StepBuilder::vision_backward(InFlight& f) {
  if (f.vision_saved.empty()) return;
  const int64_t rows = mul(mul(dims_.b, cfg_.data.images_per_sample), shape_.image_tokens);
  const auto& widths = shape_.projector_widths;
  const size_t depth = widths.size() - 1;
  // vision_saved: the selected hidden state, then per GELU its input and the next linear's input, then the mask.
  std::vector<uint32_t>& saved = f.vision_saved;
  const uint32_t mask = saved.back();
  uint32_t g = tmp(mul(dims_.e_res, rows, widths[depth]), vision_labels_.grad_features, -1);
  for (size_t i = depth; i-- > 0;) {
    if (i == 0) break;  // linear_1: its input needs no gradient, its weight's comes from g and the saved input
    // linear i+1's input gradient, then GELU's backward over its saved input.
    const uint32_t dx = tmp(mul(dims_.e, rows, widths[i]), vision_labels_.grad_projector, -1);
    drop(g);
    drop(saved[2 * i]);  // linear i+1's input (the GELU output)
    const uint32_t dg = tmp(mul(dims_.e, rows, widths[i]), vision_labels_.grad_projector, -1);
    drop(dx);
    drop(saved[2 * i - 1]);  // GELU's input (linear i's output)
    g = dg;
  }
  drop(g);
  drop(saved.front());  // linear_1's input: the tower's second-to-last hidden state
  drop(mask);
  saved.clear();
}

}  // namespace memsim
