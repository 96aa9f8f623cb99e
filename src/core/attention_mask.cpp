// transformers' 4-D attention mask (Resolved::mask; docs/versions.md 6b for the builders, 5 for SDPA): the tensor
// the layers of one micro-batch share, its build, and the copies an SDPA call makes of it. Split from
// activations.cpp (code moved, not changed).
#include <algorithm>

#include "checked.h"
#include "step_builder.h"

namespace memsim {

void StepBuilder::mask_labels() {
  if (mask_labels_made_) return;
  mask_labels_made_ = true;
  mask_labels_.mask = program_.label("attention mask, [batch, 1, seq, seq] (transformers; one tensor every layer reads)");
  mask_labels_.build = program_.label("attention mask: temporaries while transformers builds it");
  mask_labels_.buffer = program_.label("causal_mask buffer, max_position_embeddings^2 booleans (transformers 4.38)");
  mask_labels_.copy = program_.label("attention mask: one layer's copy (indexed, cast or converted for its attention call)");
  mask_labels_.padded = program_.label("attention mask padded for the memory-efficient kernel (saved)");
  mask_labels_.math_qk = program_.label("SDPA math kernel: scaled q and k (saved)");
  mask_labels_.math_scores = program_.label("SDPA math kernel: scores");
  mask_labels_.math_softmax = program_.label("SDPA math kernel: softmax (saved)");
}

// After the embeddings, once per micro-batch: the mask LlamaModel.forward builds before its first layer, where
// the version builds one for this micro-batch (for every one, or for one with padding), with the temporaries of
// its builder. The model dtype is inputs_embeds.dtype, the residual stream's (e_res); P is max_position_embeddings.
// The builders' code: 4.31-4.35 and 4.36-4.37 read in stored copies of modeling_llama.py and
// modeling_attn_mask_utils.py; 4.38 in copies of its _update_causal_mask (and issue #29484); 4.39-4.52 and
// masking_utils (4.53+) from memory of the code, the shapes in docs/versions.md 6b.
void StepBuilder::mask_forward() {
  mask_ = {};
  const auto& mk = resolved_.mask;
  if (mk.build == MaskBuild::None || !(mk.unpadded || dims_.padded)) return;
  mask_labels();
  const int64_t e = dims_.e_res;
  const int64_t ss = mul(dims_.s, dims_.s), bss = mul(dims_.b, ss);
  auto t = [&](int64_t bytes) { return tmp(bytes, mask_labels_.build, -1); };
  auto keep = [&](int64_t bytes) { return program_.alloc(Component::Activations, bytes, mask_labels_.mask, -1); };
  uint32_t mask = UINT32_MAX;
  int64_t mask_elems = bss;
  switch (mk.build) {
    case MaskBuild::Prepared: {
      // _make_causal_mask: torch.full((s, s), finfo(dtype).min) in the default fp32, masked_fill_ by a boolean
      // comparison (mask_cond < (mask_cond + 1).view(s, 1)), .to(dtype); expanded to [b, 1, s, s] as a view.
      const uint32_t full = t(mul(4, ss)), cond = t(ss);
      drop(cond);
      const uint32_t causal = t(mul(e, ss));
      drop(full);
      // _expand_mask: mask[:, None, None, :].expand(b, 1, s, s).to(dtype), 1.0 - that, and masked_fill by its
      // .to(torch.bool), the first two alive until it returns.
      const uint32_t expanded = t(mul(e, bss)), inverted = t(mul(e, bss)), flags = t(bss), filled = t(mul(e, bss));
      drop(flags), drop(expanded), drop(inverted);
      // <= 4.35: expanded_attn_mask + combined_attention_mask; 4.36-4.37 (to_4d):
      // causal_4d_mask.masked_fill(expanded_attn_mask.bool(), min).
      const uint32_t flags2 = mk.to_4d ? t(bss) : UINT32_MAX;
      mask = keep(mul(e, bss));
      if (flags2 != UINT32_MAX) drop(flags2);
      drop(filled), drop(causal);
      break;
    }
    case MaskBuild::MaxPositions: {
      const int64_t P = cfg_.model.max_position_embeddings;
      const int64_t bpp = mul(dims_.b, P, P), bps = mul(dims_.b, P, dims_.s);
      mask_elems = bpp;
      // self.causal_mask[None, None, :, :].repeat(b, 1, 1, 1) (booleans), .to(dtype), then * min_dtype.
      const uint32_t rep = t(bpp), conv = t(mul(e, bpp));
      drop(rep);
      mask = keep(mul(e, bpp));
      drop(conv);
      // The padding merge: causal_mask[..., :s].eq(0.0) * attention_mask[:, None, None, :].eq(0.0), and
      // masked_fill of that slice into a copy written back.
      const uint32_t eq = t(bps), pm = t(bps);
      drop(eq);
      const uint32_t fill = t(mul(e, bps));
      drop(pm), drop(fill);
      break;
    }
    case MaskBuild::Updated: {
      // torch.full((s, s), min_dtype, dtype), torch.triu(diagonal=1) (a new tensor), *= arange > cache_position.
      const uint32_t full = t(mul(e, ss)), tri = t(mul(e, ss));
      drop(full);
      drop(t(ss));
      // .expand(b, 1, -1, -1).clone(), made because an attention_mask is passed, then the padding merge as in 4.38.
      mask = keep(mul(e, bss));
      drop(tri);
      const uint32_t eq = t(bss), pm = t(bss);
      drop(eq);
      const uint32_t fill = t(mul(e, bss));
      drop(pm), drop(fill);
      break;
    }
    case MaskBuild::Boolean:
      // masking_utils.sdpa_mask: the causal and padding mask functions evaluated into one boolean [b, 1, s, s];
      // [b, 1, s, prefix + s] under prefix tuning, whose cache holds the prefix as past keys.
      mask_elems = mul(dims_.b, dims_.s, kv_len());
      mask = keep(mask_elems);
      break;
    case MaskBuild::BooleanToFloat: {
      // eager_mask: sdpa_mask's booleans, then torch.where(mask, 0.0, min_dtype) in the model dtype.
      const uint32_t flags = t(bss);
      mask = keep(mul(e, bss));
      drop(flags);
      break;
    }
    case MaskBuild::None:
      return;
  }
  // SDPA and padding, 4.38-4.52: rows that attend to no key are let attend to all, which the memory-efficient
  // kernel needs (pytorch#110213): causal_mask.mul(~torch.all(causal_mask == min, dim=-1)[..., None]), a new mask
  // (4.40+: AttentionMaskConverter._unmask_unattended). 4.36-4.37's _unmask_unattended writes in place.
  const bool sdpa = mk.kernel != MaskKernel::Eager;
  if (sdpa && dims_.padded && (mk.build == MaskBuild::MaxPositions || mk.build == MaskBuild::Updated)) {
    const uint32_t eq = t(mask_elems);
    const uint32_t unmasked = keep(mul(e, mask_elems));
    drop(eq), drop(mask);
    mask = unmasked;
  }
  mask_.on = true;
  mask_.tensor = mask;
}

// One layer's SDPA call given the micro-batch's mask (docs/versions.md 5). What reaches the kernel may be a copy of
// the shared mask: 4.38's cache_position index (a copy in the model dtype), the additive copy torch makes of a
// boolean mask (convert_boolean_attn_mask, in q's dtype), or autocast's cast of a float mask of the model dtype to
// q's 16 bits (scaled_dot_product_attention is lower_precision_fp in autocast_mode.cpp). The math kernel adds it
// into the scores and keeps none of it. The memory-efficient kernel keeps the bias it is given until backward: a
// padded copy when it is not aligned (pad_bias: [b, 1, s, round_up(s, 8)] from 2.1.2, or [b, h, s, round_up(s, 16)]
// after expanding it over the heads in 2.1.0-2.1.1), else the copy, else the shared mask itself by reference, which
// makes this layer hold it. `keep`: the call's graph is saved (not a no_grad forward).
void StepBuilder::sdpa_mask_inputs(int32_t layer, std::vector<uint32_t>& kept, std::vector<uint32_t>& gone, bool keep) {
  const auto& mk = resolved_.mask;
  const int64_t e = dims_.e, s = dims_.s, keys = kv_len();  // keys: s, or prefix + s under prefix tuning
  const int64_t bss = mul(dims_.b, s, keys);
  std::vector<int64_t> copies;  // bytes of each copy, in order; the last is what the kernel gets
  if (mk.build == MaskBuild::MaxPositions) copies.push_back(mul(dims_.e_res, bss));
  if (mk.build == MaskBuild::Boolean) copies.push_back(mul(e, bss));
  else if (dims_.e_res != e) copies.push_back(mul(e, bss));
  const bool mem_eff = mk.kernel == MaskKernel::MemEfficient;
  const bool aligned = keys % mk.pad_align == 0;
  // The last copy is saved when the memory-efficient kernel takes it as it is.
  for (size_t i = 0; i < copies.size(); ++i) {
    const bool saved = mem_eff && aligned && i + 1 == copies.size();
    const uint32_t c = saved ? act(copies[i], mask_labels_.copy, layer) : tmp(copies[i], mask_labels_.copy, layer);
    (saved ? kept : gone).push_back(c);
  }
  if (!mem_eff) return;
  if (!aligned) {
    const int64_t rows = mk.pad_expanded ? mul(dims_.b, dims_.a, s) : mul(dims_.b, s);
    kept.push_back(act(mul(e, rows, round_up(keys, mk.pad_align)), mask_labels_.padded, layer));
  } else if (copies.empty() && keep && !in_backward_ && mask_.holder < 0) {
    mask_.holder = layer;  // the shared mask, kept by reference; layers run upward, so this is the lowest
  }
}

}  // namespace memsim
