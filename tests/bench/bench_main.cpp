// Simulations per second (Catch2 BENCHMARK). Run natively and, compiled to wasm, under node:
//   build/native/memsim_bench     build/web/memsim_bench.js (node)
// Tests never assert timings; this binary only reports them.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include "core/catalog.h"
#include "core/heap.h"
#include "core/serialize.h"
#include "core/simulate.h"

using namespace memsim;

// As the desktop app and the CLI run (core/heap.h); Catch2 owns main, so a static initialiser does it.
static const bool heap_kept = (keep_freed_heap_memory(), true);

static Config llama70b() {
  Config c;
  c.model.hidden_size = 8192;
  c.model.num_hidden_layers = 80;
  c.model.num_attention_heads = 64;
  c.model.num_key_value_heads = 8;
  c.model.head_dim = 128;
  c.model.intermediate_size = 28672;
  c.model.vocab_size = 128256;
  c.training.gradient_accumulation_steps = 8;
  c.parallel.data_parallel_size = 64;  // ZeRO-3 over 64 H100s: fits (8 GPUs would not: 131 GiB of model states)
  c.hardware.gpu = "h100-sxm";
  return c;
}

// The distributed issue's 3D layout: a Llama-3.1-405B shape on TP 8 x PP 16 (interleaved, 2 chunks) x DP 4,
// 32 micro-batches.
Config three_d_layout() {
  Config three_d;
  three_d.model.hidden_size = 16384;
  three_d.model.num_hidden_layers = 128;
  three_d.model.num_attention_heads = 128;
  three_d.model.num_key_value_heads = 8;
  three_d.model.head_dim = 128;
  three_d.model.intermediate_size = 53248;
  three_d.model.vocab_size = 128256;
  three_d.training.framework = "megatron";
  three_d.training.precision = "bf16_fp32_grads";
  three_d.training.micro_batch_size = 1;
  three_d.training.sequence_length = 8192;
  three_d.training.gradient_accumulation_steps = 32;
  three_d.training.activation_checkpointing = "selective";
  three_d.parallel.data_parallel_size = 4;
  three_d.parallel.zero_stage = 1;
  three_d.parallel.tensor_parallel_size = 8;
  three_d.parallel.sequence_parallel = true;
  three_d.parallel.pipeline_parallel_size = 16;
  three_d.parallel.pipeline_schedule = "interleaved_1f1b";
  three_d.parallel.virtual_pipeline_stages = 2;
  three_d.hardware.gpu = "h100-sxm";
  return three_d;
}

TEST_CASE("simulation speed") {
  const Config def;
  const Config big = llama70b();
  BENCHMARK("default scenario (Llama-2-13B shape, ZeRO-3, 8 GPUs)") { return simulate(def).devices.size(); };
  BENCHMARK("Llama-3-70B shape, 8 micro-batches of accumulation") { return simulate(big).devices.size(); };
  Config oom = big;
  oom.parallel.data_parallel_size = 8;
  BENCHMARK("Llama-3-70B shape on 8 GPUs: out of memory") { return simulate(oom).devices.size(); };
  Config qlora = big;
  qlora.parallel.data_parallel_size = 1;
  qlora.parallel.zero_stage = 0;
  qlora.training.precision = "bf16_pure";
  qlora.peft.method = "lora";
  qlora.peft.base_quantization = "nf4";
  qlora.peft.target_modules = "all-linear";
  qlora.hardware.gpu = "h200";
  BENCHMARK("Llama-3-70B shape, QLoRA on all linears, one H200") { return simulate(qlora).devices.size(); };
  Config extreme;  // the hardening issue's 100T-parameter, 1M-token and 1M-GPU extremes, which must stay fast
  extreme.model.hidden_size = 65536;
  extreme.model.num_hidden_layers = 2000;
  extreme.model.num_attention_heads = 512;
  extreme.model.num_key_value_heads = 512;
  extreme.model.head_dim = 0;
  extreme.model.intermediate_size = 4 * 65536;
  extreme.training.micro_batch_size = 1;
  extreme.training.sequence_length = 1 << 20;
  extreme.parallel.data_parallel_size = 1 << 20;
  BENCHMARK("extremes: 100T parameters, 1M tokens, 1M GPUs") { return simulate(extreme).devices.size(); };
  // The distributed issue's 3D layout: a Llama-3.1-405B shape on TP 8 x PP 16 (interleaved, 2 chunks) x DP 4,
  // 32 micro-batches: every distinct device (16 stages) is simulated.
  Config three_d = three_d_layout();
  BENCHMARK("405B shape, TP 8 x PP 16 interleaved x DP 4: all 16 stages") { return simulate(three_d).devices.size(); };
  // The real-runs issue's speed target: a 1,000-step run of a 7B LoRA over a length distribution (the target is 1 s
  // natively, 100 ms the aim).
  Config run;
  run.model.hidden_size = 4096;
  run.model.num_hidden_layers = 32;
  run.model.num_attention_heads = 32;
  run.model.num_key_value_heads = 32;
  run.model.intermediate_size = 11008;
  run.training.framework = "hf_trainer";
  run.training.sequence_length = 2048;
  run.training.activation_checkpointing = "none";
  run.peft.method = "lora";
  run.parallel.data_parallel_size = 1;
  run.parallel.zero_stage = 0;
  run.data.lengths = "samples";
  run.data.sample_lengths = "p0=20,p50=150,p90=350,p99=600,p100=1100";
  run.data.steps = 1000;
  BENCHMARK("7B LoRA, a 1,000-step run of varying lengths") { return simulate(run).devices.size(); };
  // The uncertainty band (core/band.h) of an HF Trainer QLoRA fine-tune that does not state its data shape: the
  // fixed shape plus the band's run of 8 micro-batches of varying lengths, against the same with the shape stated
  // (data.padding=max_length: no run).
  Config hf = def;
  hf.model.hidden_size = 4096;
  hf.model.num_hidden_layers = 32;
  hf.model.num_attention_heads = 32;
  hf.model.num_key_value_heads = 8;
  hf.model.intermediate_size = 14336;
  hf.model.vocab_size = 128256;
  hf.training.framework = "hf_trainer";
  hf.training.sequence_length = 2048;
  hf.parallel.data_parallel_size = 1;
  hf.parallel.zero_stage = 0;
  hf.peft.method = "lora";
  hf.peft.base_quantization = "nf4";
  hf.peft.target_modules = "all-linear";
  Config hf_stated = hf;
  hf_stated.data.padding = "max_length";
  BENCHMARK("Llama-3-8B shape, QLoRA under the HF Trainer, data shape stated") { return simulate(hf_stated).devices.size(); };
  BENCHMARK("... data shape unstated: with the band's 8-micro-batch run") { return simulate(hf).devices.size(); };
  // A model program (core/architecture.h): the ViT-B/16 classifier, decoded from its JSON on every simulation, as the
  // page does on every edit.
  Config vit;
  vit.model.architecture = "vit";
  vit.model.architecture_args = "num_labels=1000";
  vit.training.framework = "hf_trainer";
  vit.training.precision = "amp_bf16";
  vit.training.micro_batch_size = 64;
  vit.training.activation_checkpointing = "none";
  vit.parallel.data_parallel_size = 1;
  vit.parallel.zero_stage = 0;
  BENCHMARK("ViT-B/16 program, batch 64, one GPU") { return simulate(vit).devices.size(); };
  // A vision-language model (core/vision_step.cpp): Qwen2.5-VL-7B (its preset) with LoRA, two 1080 x 1920 images per
  // micro-batch under ms-swift's MAX_PIXELS (1,222 image tokens each), the windowed tower decoded on every simulation.
  Config vlm;
  vlm.model = find_model_preset("qwen2.5-vl-7b")->model;
  vlm.model.vision_tower_args += ",image_height=1080,image_width=1920,max_pixels=1003520";
  vlm.training.framework = "hf_trainer";
  vlm.training.micro_batch_size = 2;
  vlm.training.sequence_length = 4096;
  vlm.training.activation_checkpointing = "full";
  vlm.parallel.data_parallel_size = 1;
  vlm.parallel.zero_stage = 0;
  vlm.peft.method = "lora";
  vlm.peft.target_modules = "all-linear";
  vlm.data.padding = "max_length";
  BENCHMARK("Qwen2.5-VL-7B LoRA, 2 x 1080p images, 4,096 tokens, one GPU") { return simulate(vlm).devices.size(); };
  // A diffusion UNet (sd_unet, 88 stages with carries): the SD 1.5 preset under diffusers' LoRA recipe (rank 4 on the
  // attentions' four linears, fp16 weights under autocast), 512 px, batch 4, the 114 KB program decoded every time.
  Config unet;
  unet.model = find_model_preset("stable-diffusion-v1-5")->model;
  unet.training.framework = "hf_loop";
  unet.training.precision = "fp16_autocast";
  unet.training.micro_batch_size = 4;
  unet.training.activation_checkpointing = "none";
  unet.parallel.data_parallel_size = 1;
  unet.parallel.zero_stage = 0;
  unet.peft.method = "lora";
  unet.peft.lora_rank = 4;
  unet.peft.target_modules = "to_k,to_q,to_v,to_out.0";
  BENCHMARK("Stable Diffusion 1.5 UNet LoRA, 512 px, batch 4, one GPU") { return simulate(unet).devices.size(); };
  // SDXL's (122 stages, 10-block transformer kinds) as its DreamBooth LoRA README runs it: 1024 px, checkpointing.
  Config xl = unet;
  xl.model = find_model_preset("stable-diffusion-xl-base-1.0")->model;
  xl.training.micro_batch_size = 1;
  xl.training.activation_checkpointing = "full";
  BENCHMARK("Stable Diffusion XL UNet LoRA, 1024 px, checkpointing, one GPU") { return simulate(xl).devices.size(); };
  // FLUX.1-dev's transformer (flux_dit: 19 double-stream block kinds, 38 single-stream blocks) under the HF blog's
  // QLoRA recipe: NF4 base, rank 4, 512 x 768, 77 text tokens, checkpointing, bf16 under autocast, 8-bit AdamW.
  Config flux = unet;
  flux.model = find_model_preset("flux-1-dev")->model;
  flux.model.architecture_args = "height=768,width=512,max_sequence_length=77,vae_on_gpu=0,text_encoder_on_gpu=0,text_encoder_2_on_gpu=0";
  flux.training.precision = "bf16_autocast";
  flux.training.optimizer = "adamw_8bit";
  flux.training.micro_batch_size = 1;
  flux.training.activation_checkpointing = "full";
  flux.peft.base_quantization = "nf4";
  BENCHMARK("FLUX.1-dev transformer QLoRA, 512 x 768, checkpointing, one GPU") { return simulate(flux).devices.size(); };
  // Stable Diffusion 3's (sd3_mmdit: 24 joint block kinds) as the Colab LoRA recipe runs it: fp16, 1024 px.
  Config sd3 = unet;
  sd3.model = find_model_preset("stable-diffusion-3-medium")->model;
  sd3.training.micro_batch_size = 1;
  sd3.training.activation_checkpointing = "full";
  sd3.training.optimizer = "adamw_8bit";
  BENCHMARK("Stable Diffusion 3 medium transformer LoRA, 1024 px, checkpointing, one GPU") { return simulate(sd3).devices.size(); };
  // Whisper large-v3 (whisper: 32 encoder and 32 decoder layers, the encoder's output a carry every cross-attention
  // reads) as the PEFT int8 notebook trains large-v2: LoRA r 32 on q and v, fp16 under autocast, batch 8, checkpointing.
  Config whisper = unet;
  whisper.model = find_model_preset("whisper-large-v3")->model;
  whisper.model.architecture_args += ",target_length=128";
  whisper.training.framework = "hf_trainer";
  whisper.training.micro_batch_size = 8;
  whisper.training.activation_checkpointing = "full";
  whisper.peft.base_quantization = "int8";
  whisper.peft.lora_rank = 32;
  whisper.peft.target_modules = "q_proj,v_proj";
  BENCHMARK("Whisper large-v3 int8 LoRA, batch 8, checkpointing, one GPU") { return simulate(whisper).devices.size(); };
  // Mamba-2 2.7B (mamba2: 64 layers of in_proj and the fused SSD mixer) fine-tuned in full, bf16, 4,096 tokens.
  Config ssm = whisper;
  ssm.model = find_model_preset("mamba2-2.7b")->model;
  ssm.model.architecture_args += ",sequence_length=4096";
  ssm.training.precision = "bf16_pure";
  ssm.training.micro_batch_size = 2;
  ssm.peft.method = "none";
  ssm.peft.base_quantization = "none";
  BENCHMARK("Mamba-2 2.7B full fine-tune, 4,096 tokens, checkpointing, one GPU") { return simulate(ssm).devices.size(); };
  // Nemotron-H 8B (nemotron_h: 52 layers in the pattern's order, 24 Mamba-2, 4 grouped-query attention, 24 MLP) with
  // LoRA on the attention's projections (the program's targets), bf16, 8,192 tokens, checkpointing.
  Config hybrid = ssm;
  hybrid.model = find_model_preset("nemotron-h-8b")->model;
  hybrid.model.architecture_args = "sequence_length=8192";
  hybrid.training.micro_batch_size = 1;
  hybrid.peft.method = "lora";
  hybrid.peft.lora_rank = 16;
  hybrid.peft.target_modules = "q_proj,k_proj,v_proj,o_proj";
  BENCHMARK("Nemotron-H 8B LoRA, 8,192 tokens, checkpointing, one GPU") { return simulate(hybrid).devices.size(); };
  // A preference objective (core/preference.h): DPO of the default scenario's model with its frozen copy, the policy's
  // forward and backward of twice the rows and the reference's no-grad forward in every micro-batch.
  Config dpo;
  dpo.training.framework = "hf_trainer";
  dpo.training.objective = "dpo";
  dpo.data.padding = "max_length";  // the data shape stated: no band run of unstated lengths (the row above)
  BENCHMARK("default scenario as DPO (a frozen copy, the reference's forward)") { return simulate(dpo).devices.size(); };
  // GRPO (core/rollout.h): the default scenario's model generating 4,096-token rollouts with model.generate under
  // ZeRO-3 (the whole model gathered, a KV cache grown over 256 replayed decode steps), then trained on.
  Config grpo;
  grpo.training.framework = "hf_trainer";
  grpo.training.objective = "grpo";
  grpo.training.completion_length = 1024;
  grpo.training.num_generations = 8;
  grpo.data.padding = "max_length";
  BENCHMARK("default scenario as GRPO (generate's KV cache, then training)") { return simulate(grpo).devices.size(); };
}

// Links: the page encodes one on every change of the setup (publish) and decodes one on load and on hashchange.
//   memsim_bench links --benchmark-samples 20
TEST_CASE("links") {
  const Config def;
  // The 405B layout above, with the model as its catalogue preset gives it (the page picks it so).
  Config three_d = three_d_layout();
  three_d.model.name = "Llama 3.1 405B";
  three_d.model.num_hidden_layers = 126;
  three_d.model.head_dim = 0;
  three_d.model.max_position_embeddings = 131072;
  three_d.parallel.virtual_pipeline_stages = Config{}.parallel.virtual_pipeline_stages;
  const std::string def_link = config_to_fragment(def), layout_link = config_to_fragment(three_d);
  const std::string full = config_to_full_fragment(def);
  BENCHMARK("link decode: the default setup (short)") { return config_from_fragment(def_link).ok; };
  BENCHMARK("link decode: the 405B layout (short, a preset)") { return config_from_fragment(layout_link).ok; };
  BENCHMARK("link decode: the default setup, full form (every field)") { return config_from_fragment(full).ok; };
  BENCHMARK("link encode: the 405B layout (short)") { return config_to_fragment(three_d).size(); };
}
