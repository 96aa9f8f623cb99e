"""Unit tests of the calibration harness that need no GPU and no torch.

    python3 -m unittest discover -s tools/calibrate -p 'test_*.py'

They test the config -> plan translation (the dict for AutoConfig, the attention implementation, dtypes, the
optimizer, checkpointing, loss and PEFT choices, and the refusal of what the harness cannot reproduce), the record
format, compare.py's arithmetic, and the sweep. Tests that need memsim-cli (build/native/memsim-cli) or
transformers skip with a message where those are missing; none imports torch.
"""

import contextlib
import copy
import importlib.util
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import calibrate  # noqa: E402
import compare  # noqa: E402
import translate as tr  # noqa: E402

CLI = os.environ.get("MEMSIM_CLI") or os.path.join(REPO, "build", "native", "memsim-cli")
HAVE_CLI = os.path.exists(CLI)
SWEEP = os.path.join(HERE, "sweep.json")
SHARED_CASES = os.path.join(os.path.dirname(REPO), "shared", "validation", "cases.jsonl")
HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
if importlib.util.find_spec("torch") is None:
    print("test_calibrate: PyTorch is not installed here, so no training step runs; these tests cover the "
          "translation, the records and the comparison (tests/validation/measured/ holds GPU runs)", file=sys.stderr)

LLAMA_1B = {
    "name": "Llama-3.2-1B shape", "model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192,
    "vocab_size": 128256, "tie_word_embeddings": True, "max_position_embeddings": 131072, "hidden_act": "silu",
    "rope_theta": 500000.0, "rms_norm_eps": 1e-05, "architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16",
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}


def config(model=None, **training):
    t = {"framework": "hf_loop", "precision": "bf16_pure", "optimizer": "adamw", "optimizer_impl": "fused",
         "micro_batch_size": 2, "sequence_length": 512, "activation_checkpointing": "none"}
    t.update(training)
    return {"schema": 1, "model": copy.deepcopy(model or LLAMA_1B), "training": t,
            "parallel": {"data_parallel_size": 1, "zero_stage": 0}, "hardware": {"gpu": "h100-sxm"}}


def refused(cfg):
    """The fields translate() refuses, or [] when it accepts."""
    try:
        tr.translate(cfg)
        return []
    except tr.Unsupported as e:
        return e.fields


class TorchFree(unittest.TestCase):
    def test_modules_do_not_import_torch(self):
        code = ("import sys, json; sys.path.insert(0, %r); import translate, calibrate, compare; "
                "translate.translate(json.loads(%r)); "
                "bad = [m for m in ('torch', 'transformers', 'peft', 'bitsandbytes') if m in sys.modules]; "
                "print(bad); sys.exit(1 if bad else 0)") % (HERE, json.dumps(config()))
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)


class ModelTranslation(unittest.TestCase):
    def test_llama_hf_config(self):
        plan = tr.translate(config())
        hf = plan["hf_config"]
        self.assertEqual(plan["model_type"], "llama")
        self.assertEqual(plan["model_class"], "AutoModelForCausalLM")
        for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                  "intermediate_size", "vocab_size", "tie_word_embeddings", "hidden_act", "head_dim"):
            self.assertEqual(hf[k], LLAMA_1B[k], k)
        self.assertFalse(hf["use_cache"])
        self.assertFalse(hf["attention_bias"])
        self.assertFalse(hf["mlp_bias"])
        # HF keys pass through; bookkeeping and memsim-only keys do not
        self.assertEqual(hf["rope_theta"], 500000.0)
        self.assertEqual(hf["rope_scaling"]["rope_type"], "llama3")
        for k in ("name", "architectures", "torch_dtype", "model_type", "norm_type", "mlp_gated", "task_head"):
            self.assertNotIn(k, hf)
        self.assertEqual(plan["expected_params"], 1235814400)  # Llama-3.2-1B

    def test_head_dim_zero_means_hidden_over_heads(self):
        m = dict(LLAMA_1B, head_dim=0)
        self.assertEqual(tr.translate(config(m))["hf_config"]["head_dim"], 64)
        m = dict(LLAMA_1B)
        del m["head_dim"]
        self.assertEqual(tr.translate(config(m))["hf_config"]["head_dim"], 64)

    def test_absent_kv_heads_means_mha_as_memsim(self):
        m = dict(LLAMA_1B)
        del m["num_key_value_heads"]
        self.assertEqual(tr.translate(config(m))["hf_config"]["num_key_value_heads"], 32)

    def test_memsim_full_dump_is_accepted(self):
        # `memsim-cli config` writes every structural field; for llama they agree with transformers' class
        m = dict(LLAMA_1B, norm_type="rmsnorm", mlp_gated=True, qkv_bias=False, qk_norm=False, qk_norm_per_head=True,
                 norms_per_layer=2, position_embedding_type="rope", attention_dropout=0.0, hidden_dropout=0.0,
                 num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0, shared_expert_intermediate_size=0,
                 first_k_dense_replace=0, router_bias=False, moe_capacity_factor=0.0, q_lora_rank=0, kv_lora_rank=0,
                 qk_nope_head_dim=0, qk_rope_head_dim=0, v_head_dim=0, post_layernorm=False, type_vocab_size=0,
                 task_head="causal_lm", num_labels=2)
        hf = tr.translate(config(m))["hf_config"]
        for k in ("norm_type", "num_experts", "kv_lora_rank", "task_head", "num_labels", "post_layernorm"):
            self.assertNotIn(k, hf)

    def test_structure_mismatches_are_refused(self):
        self.assertIn("model.norm_type", refused(config(dict(LLAMA_1B, norm_type="layernorm"))))
        self.assertIn("model.mlp_gated", refused(config(dict(LLAMA_1B, mlp_gated=False))))
        self.assertIn("model.qk_norm", refused(config(dict(LLAMA_1B, qk_norm=True))))
        self.assertIn("model.hidden_dropout", refused(config(dict(LLAMA_1B, hidden_dropout=0.1))))
        self.assertIn("model.task_head", refused(config(dict(LLAMA_1B, task_head="sequence_classification"))))
        self.assertIn("model.task_head", refused(config(dict(LLAMA_1B, architectures=["LlamaForSequenceClassification"]))))
        qwen = {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 2, "num_attention_heads": 14,
                "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 1000}
        self.assertEqual(refused(config(qwen)), [])
        self.assertIn("model.qkv_bias", refused(config(dict(qwen, qkv_bias=False))))
        self.assertIn("model.attention_bias", refused(config(dict(qwen, attention_bias=True))))
        self.assertIn("model.mlp_bias", refused(config(dict(qwen, mlp_bias=True))))

    def test_unsupported_model_types_and_shapes(self):
        self.assertIn("model.model_type", refused(config(dict(LLAMA_1B, model_type="gpt2"))))
        self.assertIn("model.model_type", refused(config(dict(LLAMA_1B, model_type="bert"))))
        self.assertIn("model.num_key_value_heads", refused(config(dict(LLAMA_1B, num_key_value_heads=7))))
        self.assertIn("model.hidden_size", refused(config({"model_type": "llama", "num_hidden_layers": 2})))
        self.assertIn("model.text_config", refused(config({"model_type": "llama", "text_config": {}})))
        self.assertIn("model.quantization_config", refused(config(dict(LLAMA_1B, quantization_config={"x": 1}))))
        self.assertIn("model.num_experts", refused(config(dict(LLAMA_1B, num_experts=8))))
        self.assertIn("model.pretraining_tp", refused(config(dict(LLAMA_1B, pretraining_tp=2))))

    def test_qwen2_qwen3_biases_and_norms(self):
        qwen3 = {"model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
                 "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936,
                 "tie_word_embeddings": True}
        plan = tr.translate(config(qwen3))
        self.assertEqual(plan["expected_params"], 596049920)  # Qwen3-0.6B
        self.assertFalse(plan["hf_config"]["use_sliding_window"])
        qwen2 = {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
                 "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
                 "tie_word_embeddings": True}
        self.assertEqual(tr.translate(config(qwen2))["expected_params"], 494032768)  # Qwen2.5-0.5B

    def test_sliding_window(self):
        mistral = {"model_type": "mistral", "hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8,
                   "num_key_value_heads": 2, "intermediate_size": 2048, "vocab_size": 1000}
        plan = tr.translate(config(mistral))
        self.assertIsNone(plan["hf_config"]["sliding_window"])  # full attention, as memsim models
        self.assertIn("model.sliding_window", refused(config(dict(mistral, sliding_window=256))))
        self.assertEqual(refused(config(dict(mistral, sliding_window=4096))), [])
        qwen2 = {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 2, "num_attention_heads": 14,
                 "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 1000}
        self.assertIn("model.use_sliding_window",
                      refused(config(dict(qwen2, use_sliding_window=True, sliding_window=128))))

    def test_moe(self):
        mixtral = {"model_type": "mixtral", "hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16,
                   "num_key_value_heads": 4, "intermediate_size": 2816, "num_local_experts": 8,
                   "num_experts_per_tok": 2, "vocab_size": 32000}
        plan = tr.translate(config(mixtral))
        self.assertEqual(plan["hf_config"]["num_local_experts"], 8)
        self.assertEqual(plan["hf_config"]["num_experts_per_tok"], 2)
        self.assertNotIn("num_experts", plan["hf_config"])
        self.assertEqual(plan["effective_model"]["num_experts"], 8)
        self.assertEqual(plan["expected_params"], 640238592)
        m = dict(mixtral, num_experts=8)
        del m["num_local_experts"]
        self.assertEqual(tr.translate(config(m))["hf_config"]["num_local_experts"], 8)
        self.assertIn("model.moe_intermediate_size", refused(config(dict(mixtral, moe_intermediate_size=512))))
        self.assertIn("model.first_k_dense_replace", refused(config(dict(mixtral, first_k_dense_replace=1))))
        self.assertIn("model.num_experts", refused(config(dict(mixtral, num_local_experts=0))))
        self.assertIn("model.output_router_logits", refused(config(dict(mixtral, output_router_logits=True))))

        q = {"model_type": "qwen3_moe", "hidden_size": 1024, "num_hidden_layers": 12, "num_attention_heads": 16,
             "num_key_value_heads": 4, "head_dim": 64, "intermediate_size": 3072, "num_experts": 32,
             "num_experts_per_tok": 4, "vocab_size": 32000}
        hf = tr.translate(config(dict(q, first_k_dense_replace=2)))["hf_config"]
        self.assertEqual(hf["mlp_only_layers"], [0, 1])
        self.assertEqual(hf["moe_intermediate_size"], 3072)  # 0 = intermediate_size in memsim
        self.assertEqual(hf["decoder_sparse_step"], 1)
        self.assertIn("model.decoder_sparse_step", refused(config(dict(q, decoder_sparse_step=2))))
        self.assertIn("model.mlp_only_layers", refused(config(dict(q, mlp_only_layers=[3]))))
        self.assertIn("model.shared_expert_intermediate_size",
                      refused(config(dict(q, shared_expert_intermediate_size=512))))


class TrainingTranslation(unittest.TestCase):
    def test_attention(self):
        self.assertEqual(tr.translate(config(attention="auto"))["attn_implementation"], "sdpa")
        self.assertEqual(tr.translate(config(attention="sdpa"))["attn_implementation"], "sdpa")
        plan = tr.translate(config(attention="sdpa_repeat_kv"))
        self.assertEqual(plan["attn_implementation"], "sdpa")
        self.assertTrue(any("sdpa_repeat_kv" in n for n in plan["notes"]))
        self.assertEqual(tr.translate(config(attention="eager"))["attn_implementation"], "eager")
        plan = tr.translate(config(attention="flash_attention_2"))
        self.assertEqual(plan["attn_implementation"], "flash_attention_2")
        self.assertIn("flash_attn", plan["requires"])
        self.assertIn("training.attention", refused(config(attention="flash_attention_2", precision="fp32")))
        self.assertIn("training.attention", refused(config(attention="xformers")))

    def test_precision(self):
        expect = {"fp32": ("float32", None, False), "amp_bf16": ("float32", "bfloat16", False),
                  "amp_fp16": ("float32", "float16", True), "bf16_pure": ("bfloat16", None, False)}
        for prec, (dtype, autocast, scaler) in expect.items():
            plan = tr.translate(config(precision=prec))
            self.assertEqual((plan["param_dtype"], plan["autocast_dtype"], plan["grad_scaler"]),
                             (dtype, autocast, scaler), prec)
        for prec in ("bf16_mixed", "fp16_mixed", "bf16_fp32_grads", "fp8"):
            self.assertIn("training.precision", refused(config(precision=prec)), prec)
        # 16-bit weights under autocast; fp16's GradScaler unscales fp32 gradients only, so it needs fp32 adapters
        self.assertEqual(tr.translate(config(precision="bf16_autocast"))["autocast_dtype"], "bfloat16")
        self.assertIn("training.precision", refused(config(precision="fp16_autocast")))
        lora = config(precision="fp16_autocast")
        lora["peft"] = {"method": "lora", "target_modules": "q_proj,k_proj,v_proj,o_proj", "adapter_dtype": "fp32",
                        "base_quantization": "nf4", "double_quantization": True, "prepare_kbit": False}
        plan = tr.translate(lora)
        self.assertEqual((plan["param_dtype"], plan["autocast_dtype"], plan["grad_scaler"]),
                         ("float16", "float16", True))
        self.assertEqual(plan["peft"]["quantization"]["compute_dtype"], "float16")
        for dtype in ("fp16", "bf16"):  # GradScaler unscales fp32 gradients only
            lora["peft"]["adapter_dtype"] = dtype
            self.assertIn("training.precision", refused(lora), dtype)
        c = config()
        del c["training"]["precision"]  # memsim's default is bf16_mixed: refused, and said so
        with self.assertRaises(tr.Unsupported) as ctx:
            tr.translate(c)
        self.assertIn("not given", str(ctx.exception))

    def test_optimizers(self):
        plan = tr.translate(config(optimizer="adamw", optimizer_impl="foreach"))
        self.assertEqual(plan["optimizer"]["class"], "torch.optim.AdamW")
        self.assertEqual(plan["optimizer"]["kwargs"], {"lr": 1e-5, "foreach": True})
        self.assertEqual(tr.translate(config(optimizer="adam", optimizer_impl="fused"))["optimizer"]["kwargs"],
                         {"lr": 1e-5, "fused": True})
        self.assertEqual(tr.translate(config(optimizer_impl="for_loop"))["optimizer"]["kwargs"],
                         {"lr": 1e-5, "foreach": False})
        sgd = tr.translate(config(optimizer="sgd", optimizer_impl="foreach"))["optimizer"]
        self.assertEqual((sgd["class"], sgd["kwargs"]["momentum"]), ("torch.optim.SGD", 0.0))
        self.assertEqual(tr.translate(config(optimizer="sgd_momentum"))["optimizer"]["kwargs"]["momentum"], 0.9)
        ada = tr.translate(config(optimizer="adafactor", optimizer_impl="for_loop"))["optimizer"]
        self.assertEqual((ada["class"], ada["kwargs"]), ("torch.optim.Adafactor", {"lr": 1e-3, "foreach": False}))
        self.assertIn("training.optimizer_impl", refused(config(optimizer="adafactor", optimizer_impl="fused")))
        # hf_trainer's auto is fused, which Adafactor lacks: refused rather than silently changed
        self.assertIn("training.optimizer_impl",
                      refused(config(optimizer="adafactor", optimizer_impl="auto", framework="hf_trainer")))
        for name, cls in (("adamw_8bit", "bitsandbytes.optim.AdamW8bit"),
                          ("paged_adamw", "bitsandbytes.optim.PagedAdamW32bit"),
                          ("paged_adamw_8bit", "bitsandbytes.optim.PagedAdamW8bit")):
            plan = tr.translate(config(optimizer=name, optimizer_impl="auto"))
            self.assertEqual(plan["optimizer"]["class"], cls)
            self.assertIn("bitsandbytes", plan["requires"])
            self.assertIn("training.optimizer_impl", refused(config(optimizer=name, optimizer_impl="fused")))
        self.assertEqual(refused(config(optimizer="lion", optimizer_impl="auto", precision="fp32")), [])
        self.assertIn("training.optimizer", refused(config(optimizer="lion", optimizer_impl="auto")))
        self.assertIn("training.optimizer", refused(config(optimizer="rmsprop")))

    def test_frameworks(self):
        loop = tr.translate(config(framework="hf_loop", optimizer_impl="auto"))
        self.assertEqual((loop["holds_outputs"], loop["param_groups"], loop["optimizer"]["impl"]), (True, 1, "foreach"))
        self.assertEqual(loop["loss"]["impl"], "hf_fp32_upcast")
        trainer = tr.translate(config(framework="hf_trainer", optimizer_impl="auto"))
        self.assertEqual((trainer["holds_outputs"], trainer["param_groups"], trainer["optimizer"]["impl"]),
                         (False, 2, "fused"))
        for fw in ("torchtune", "litgpt", "deepspeed", "megatron", "keras"):
            self.assertIn("training.framework", refused(config(framework=fw)), fw)
        c = config()
        del c["training"]["framework"]  # memsim's default: deepspeed
        self.assertIn("training.framework", refused(c))

    def test_checkpointing_and_loss(self):
        self.assertEqual(tr.translate(config(activation_checkpointing="full"))["checkpointing"]["mode"], "full")
        ck = tr.translate(config(activation_checkpointing="every_k", checkpoint_every_k_layers=3))["checkpointing"]
        self.assertEqual((ck["mode"], ck["every_k_layers"], ck["use_reentrant"]), ("every_k", 3, False))
        self.assertIn("training.activation_checkpointing", refused(config(activation_checkpointing="selective")))
        c = config()
        del c["training"]["activation_checkpointing"]  # memsim's default: full
        self.assertEqual(tr.translate(c)["checkpointing"]["mode"], "full")
        self.assertEqual(tr.translate(config(loss="chunked_fp32", loss_chunks=16))["loss"],
                         {"impl": "chunked_fp32", "chunks": 16})
        self.assertEqual(tr.translate(config(loss="full_fp32"))["loss"], {"impl": "full_fp32", "chunks": None})
        self.assertIn("liger_kernel", tr.translate(config(loss="fused_linear"))["requires"])
        self.assertIn("training.loss", refused(config(loss="mse")))

    def test_refusals(self):
        self.assertIn("training.compile", refused(config(compile=True)))
        self.assertIn("training.activation_offload", refused(config(activation_offload=True)))
        self.assertIn("training.norm_impl", refused(config(norm_impl="fused")))
        self.assertIn("training.norm_impl", refused(config(norm_impl="fp32_scale")))
        self.assertEqual(refused(config(norm_impl="eager_fp32")), [])
        self.assertIn("training.optimizer_in_backward",
                      refused(config(optimizer_in_backward=True, gradient_accumulation_steps=2)))
        self.assertIn("training.optimizer_in_backward",
                      refused(config(optimizer_in_backward=True, precision="amp_fp16")))
        self.assertTrue(tr.translate(config(optimizer_in_backward=True))["optimizer_in_backward"])
        self.assertIn("training.unknown_flag", refused(config(unknown_flag=1)))
        self.assertIn("training.micro_batch_size", refused(config(micro_batch_size=0)))
        c = config()
        c["fsdp"] = {}
        self.assertIn("fsdp", refused(c))
        c = config()
        c["schema"] = 4
        self.assertIn("schema", refused(c))

    def test_schema_2_switches_and_versions(self):
        # Schema 2's switches are auto / true / false; auto is what memsim derives for the newest versions, which is
        # what the installed libraries run. A stated version or a date would derive switches this run does not have.
        c = config()
        c["schema"] = 2
        c["training"].update(zero_grad_set_to_none="auto", softmax_saves_input="auto")
        c["hardware"]["expandable_segments"] = "auto"
        plan = tr.translate(c)
        self.assertTrue(plan["zero_grad_set_to_none"])
        self.assertFalse(plan["expandable_segments"])
        c["training"]["zero_grad_set_to_none"] = "false"
        c["hardware"]["expandable_segments"] = "true"
        plan = tr.translate(c)
        self.assertFalse(plan["zero_grad_set_to_none"])
        self.assertTrue(plan["expandable_segments"])
        c["training"]["softmax_saves_input"] = "true"  # torch <= 1.10's softmax: the installed torch has no such thing
        self.assertEqual(refused(c), ["training.softmax_saves_input"])
        c = config()
        c["schema"] = 2
        c["versions"] = {"torch": "1.13", "transformers": "latest", "date": "2023-10"}
        self.assertEqual(sorted(refused(c)), ["versions.date", "versions.torch"])
        c["versions"] = {"torch": "latest", "pytorch": "2.1"}
        self.assertEqual(refused(c), ["versions.pytorch"])

    def test_parallel(self):
        c = config()
        del c["parallel"]  # memsim's default: 8 GPUs, ZeRO-3
        with self.assertRaises(tr.Unsupported) as ctx:
            tr.translate(c)
        self.assertEqual(set(ctx.exception.fields), {"parallel.data_parallel_size", "parallel.zero_stage"})
        self.assertIn("memsim's default is 8", str(ctx.exception))
        c = config()
        c["parallel"] = {"data_parallel_size": 1, "zero_stage": 2}
        self.assertEqual(refused(c), ["parallel.zero_stage"])
        c["parallel"] = {"data_parallel_size": 2, "zero_stage": 0}
        self.assertEqual(refused(c), ["parallel.data_parallel_size"])

    def test_expandable_segments(self):
        self.assertFalse(tr.translate(config())["expandable_segments"])  # memsim's default allocator
        c = config()
        c["hardware"]["expandable_segments"] = True
        self.assertTrue(tr.translate(c)["expandable_segments"])  # calibrate.py sets PYTORCH_CUDA_ALLOC_CONF from it
        c["hardware"]["expandable_segments"] = "yes"
        self.assertEqual(refused(c), ["hardware.expandable_segments"])

    def test_every_error_is_reported(self):
        c = config(compile=True, precision="bf16_mixed", framework="torchtune")
        c["parallel"]["zero_stage"] = 3
        fields = refused(c)
        for f in ("training.compile", "training.precision", "training.framework", "parallel.zero_stage"):
            self.assertIn(f, fields)

    def test_batch_and_steps(self):
        plan = tr.translate(config(micro_batch_size=3, sequence_length=777, gradient_accumulation_steps=4), steps=5)
        self.assertEqual(plan["batch"], {"micro_batch_size": 3, "sequence_length": 777,
                                         "gradient_accumulation_steps": 4, "steps": 5, "lengths": None,
                                         "empty_cache_steps": 0, "padded_rows": False})

    def test_listed_micro_batch_lengths(self):
        c = config(micro_batch_size=2, sequence_length=1024, gradient_accumulation_steps=2, empty_cache_steps=3)
        c["data"] = {"lengths": "micro_batches", "micro_batch_lengths": "100, 900,300"}
        plan = tr.translate(c)
        self.assertEqual(plan["batch"]["lengths"], [100, 900, 300])
        self.assertEqual(plan["batch"]["steps"], 2)  # the list once, as memsim replays it
        self.assertEqual(plan["batch"]["empty_cache_steps"], 3)
        c["data"]["steps"] = 7
        self.assertEqual(tr.translate(c)["batch"]["steps"], 7)
        c["data"] = {"lengths": "samples", "sample_lengths": "p50=100"}
        self.assertIn("data.lengths", refused(c))
        c["data"] = {"lengths": "micro_batches", "micro_batch_lengths": "100,x"}
        self.assertIn("data.micro_batch_lengths", refused(c))

    def test_reentrant_checkpointing_is_refused_not_ignored(self):
        self.assertIn("training.checkpoint_reentrant",
                      refused(config(activation_checkpointing="full", checkpoint_reentrant=True)))
        self.assertEqual(refused(config(activation_checkpointing="full", checkpoint_reentrant=False)), [])

    def test_padded_rows_where_memsim_takes_micro_batches_to_be_padded(self):
        # memsim (data_shape.cpp plan_run): listed lengths that vary, more than one row, a padding other than none
        c = config(micro_batch_size=4, sequence_length=2048)
        c["data"] = {"lengths": "micro_batches", "micro_batch_lengths": "1550,400"}
        plan = tr.translate(c)
        self.assertTrue(plan["batch"]["padded_rows"])
        self.assertTrue(any("right-padded" in n for n in plan["notes"]))
        c["data"]["padding"] = "max_length"
        self.assertTrue(tr.translate(c)["batch"]["padded_rows"])
        c["data"]["padding"] = "none"  # memsim keeps such rows whole
        self.assertFalse(tr.translate(c)["batch"]["padded_rows"])
        c["data"] = {"lengths": "micro_batches", "micro_batch_lengths": "1550,1550"}  # one length: packed rows
        self.assertFalse(tr.translate(c)["batch"]["padded_rows"])
        c["data"] = {"lengths": "micro_batches", "micro_batch_lengths": "1550,400"}
        c["training"]["micro_batch_size"] = 1  # one row is its own length
        self.assertFalse(tr.translate(c)["batch"]["padded_rows"])
        # the rows: the first at the listed length, the rest fewer, evenly spread; all at least 1
        self.assertEqual(tr.padded_row_lengths(4, 10), [10, 8, 5, 3])
        self.assertEqual(tr.padded_row_lengths(8, 1550)[0], 1550)
        self.assertEqual(tr.padded_row_lengths(3, 1), [1, 1, 1])
        bad = config(micro_batch_size=4)
        bad["data"] = {"lengths": "micro_batches", "micro_batch_lengths": "512,128", "padding": "left",
                       "pad_to_multiple_of": 0}
        self.assertEqual(sorted(refused(bad)), ["data.pad_to_multiple_of", "data.padding"])
        bad["data"].update(padding="longest", pad_to_multiple_of=8)  # listed lengths are padded lengths already
        self.assertEqual(refused(bad), [])
        dpo = config(micro_batch_size=2, objective="dpo")
        dpo["data"] = {"lengths": "micro_batches", "micro_batch_lengths": "512,128"}
        self.assertIn("data.padding", refused(dpo))


class PreferenceTranslation(unittest.TestCase):
    """training.objective dpo: the recipe of DPOTrainer._compute_loss (calibrate.py _dpo_loss_fn)."""

    def test_dpo_full_takes_a_copy_and_lora_the_adapters_off(self):
        plan = tr.translate(config(framework="hf_trainer", objective="dpo"))
        self.assertEqual(plan["objective"]["kind"], "dpo")
        self.assertEqual(plan["objective"]["reference"], "copy")
        self.assertTrue(plan["objective"]["logits_fp32"])
        c = config(framework="hf_trainer", objective="dpo")
        c["peft"] = {"method": "lora", "lora_rank": 8, "lora_alpha": 16.0, "target_modules": "q_proj,v_proj",
                     "adapter_dtype": "fp32"}
        self.assertEqual(tr.translate(c)["objective"]["reference"], "adapter_disabled")
        c["training"]["reference_model"] = "precomputed"
        self.assertEqual(tr.translate(c)["objective"]["reference"], "precomputed")
        self.assertIsNone(tr.translate(config())["objective"])

    def test_dpo_refusals_name_their_fields(self):
        self.assertIn("training.framework", refused(config(objective="dpo")))  # hf_loop: not TRL's trainer
        self.assertIn("training.objective", refused(config(framework="hf_trainer", objective="orpo")))
        self.assertIn("training.objective", refused(config(framework="hf_trainer", objective="simpo")))
        self.assertIn("training.reference_model",
                      refused(config(framework="hf_trainer", objective="dpo", reference_model="adapter_disabled")))
        self.assertIn("training.loss", refused(config(framework="hf_trainer", objective="dpo", loss="full_fp32")))


    def test_kto_reproduces_ktotrainer_and_refuses_what_it_refuses(self):
        plan = tr.translate(config(framework="hf_trainer", objective="kto", micro_batch_size=2))
        self.assertEqual(plan["objective"]["kind"], "kto")
        self.assertEqual(plan["objective"]["reference"], "copy")
        self.assertIn("KTOTrainer", plan["objective"]["how"])
        self.assertIn("training.micro_batch_size",
                      refused(config(framework="hf_trainer", objective="kto", micro_batch_size=1)))
        self.assertIn("training.nll_alpha",
                      refused(config(framework="hf_trainer", objective="kto", micro_batch_size=2, nll_alpha=1.0)))
        self.assertIn("training.reference_model",
                      refused(config(framework="hf_trainer", objective="kto", micro_batch_size=2, reference_model="none")))


class GrpoTranslation(unittest.TestCase):
    """training.objective grpo: the recipe of GRPOTrainer with model.generate (calibrate.py grpo_rollout)."""

    def test_generation_cadence_other_than_one_per_step_is_refused(self):
        c = config(framework="hf_trainer", objective="grpo", micro_batch_size=4, sequence_length=768,
                   gradient_accumulation_steps=2, num_generations=4, completion_length=256)
        self.assertEqual(refused(c), [])
        c["training"]["steps_per_generation"] = 4
        self.assertIn("training.steps_per_generation", refused(c))
        c["training"]["steps_per_generation"] = 0
        c["training"]["num_iterations"] = 2
        self.assertIn("training.num_iterations", refused(c))

    def test_grpo_generates_the_steps_completions_and_scores_by_beta(self):
        plan = tr.translate(config(framework="hf_trainer", objective="grpo", completion_length=128,
                                   gradient_accumulation_steps=4))
        o = plan["objective"]
        self.assertEqual((o["kind"], o["reference"]), ("grpo", "none"))  # beta 0 by default from TRL 0.19
        self.assertEqual((o["prompt_length"], o["completion_length"], o["generation_rows"]), (384, 128, 8))
        c = config(framework="hf_trainer", objective="grpo", reference_model="copy")
        self.assertEqual(tr.translate(c)["objective"]["reference"], "copy")

    def test_grpo_refusals_name_their_fields(self):
        self.assertIn("training.generation_engine",
                      refused(config(framework="hf_trainer", objective="grpo", generation_engine="vllm_colocate")))
        self.assertIn("training.reward_model",
                      refused(config(framework="hf_trainer", objective="grpo", reward_model="same_as_policy")))
        self.assertIn("training.completion_length",
                      refused(config(framework="hf_trainer", objective="grpo", completion_length=512)))
        self.assertIn("training.framework", refused(config(objective="grpo")))


class PpoTranslation(unittest.TestCase):
    """training.objective ppo: the recipe of PPOTrainer (calibrate.py ppo_rollout, _ppo_loss_fn, ppo_update)."""

    LORA = {"method": "lora", "lora_rank": 8, "lora_alpha": 16.0, "target_modules": "q_proj,v_proj",
            "adapter_dtype": "fp32"}

    def ppo(self, peft=None, **training):
        t = dict(framework="hf_trainer", objective="ppo", reward_model="same_as_policy", micro_batch_size=4,
                 sequence_length=768, gradient_accumulation_steps=2, completion_length=256)
        t.update(training)
        c = config(**t)
        if peft:
            c["peft"] = dict(peft)
        return c

    def test_ppo_generates_the_updates_responses_and_scores_them(self):
        plan = tr.translate(self.ppo())
        o = plan["objective"]
        self.assertEqual((o["kind"], o["reference"], o["value_model"], o["reward_model"]),
                         ("ppo", "copy", "full", "same_as_policy"))
        self.assertEqual((o["prompt_length"], o["completion_length"]), (512, 256))
        self.assertEqual((o["generation_rows"], o["chunk_rows"], o["num_ppo_epochs"]), (8, 8, 1))
        self.assertTrue(o["logits_fp32"])
        self.assertFalse(o["rollout_autocast"])  # accelerate's autocast wraps only PolicyAndValueWrapper.forward
        self.assertIn("PPOTrainer", o["how"])
        self.assertIsNone(plan["batch"]["lengths"])
        self.assertEqual(plan["expected_adapter_params"], 0)
        json.dumps(plan)

    def test_rollout_chunks_of_local_rollout_forward_batch_size(self):
        o = tr.translate(self.ppo(micro_batch_size=16, gradient_accumulation_steps=8))["objective"]
        self.assertEqual((o["generation_rows"], o["chunk_rows"]), (128, 64))
        o = tr.translate(self.ppo(micro_batch_size=1, gradient_accumulation_steps=1))["objective"]
        self.assertEqual((o["generation_rows"], o["chunk_rows"]), (1, 1))

    def test_value_and_reward_models_are_the_policy_as_a_sequence_classifier(self):
        # Llama-3.2-1B ties lm_head to the embeddings: the classifier drops nothing and adds a 2048 x 1 score head
        o = tr.translate(self.ppo())["objective"]
        self.assertEqual(o["score_model_params"], 1235814400 + 2048)
        untied = self.ppo()
        untied["model"]["tie_word_embeddings"] = False
        plan = tr.translate(untied)
        self.assertEqual(plan["objective"]["score_model_params"], plan["expected_params"] - 128256 * 2048 + 2048)

    def test_peft_takes_the_adapters_off_and_value_model_peft_is_accepted(self):
        o = tr.translate(self.ppo(peft=self.LORA))["objective"]
        self.assertEqual((o["reference"], o["value_model"]), ("adapter_disabled", "full"))
        o = tr.translate(self.ppo(peft=self.LORA, value_model="peft", reference_model="copy"))["objective"]
        self.assertEqual((o["reference"], o["value_model"]), ("copy", "peft"))
        o = tr.translate(self.ppo(num_iterations=4))["objective"]
        self.assertEqual(o["num_ppo_epochs"], 4)

    def test_ppo_refusals_name_their_fields(self):
        quant = dict(self.LORA, base_quantization="nf4")
        head = dict(self.LORA, target_modules="q_proj,lm_head")
        varlen = self.ppo()
        varlen["data"] = {"lengths": "micro_batches", "micro_batch_lengths": "512,768"}
        cases = [
            ("training.framework", self.ppo(framework="hf_loop")),
            ("training.generation_engine", self.ppo(generation_engine="vllm_colocate")),
            ("training.generation_engine", self.ppo(generation_engine="vllm_server")),
            ("training.reward_model", self.ppo(reward_model="none")),
            ("training.reference_model", self.ppo(reference_model="none")),
            ("training.reference_model", self.ppo(reference_model="precomputed")),
            ("training.reference_model", self.ppo(reference_model="adapter_disabled")),  # no PEFT
            ("training.value_model", self.ppo(value_model="peft")),  # no PEFT
            ("training.value_model", self.ppo(value_model="frozen")),
            ("training.value_model", self.ppo(peft=head, value_model="peft")),
            ("training.zero_grad_at", self.ppo(zero_grad_at="before_backward")),
            ("training.completion_length", self.ppo(completion_length=768)),
            ("training.completion_length", self.ppo(completion_length=0)),
            ("training.loss", self.ppo(loss="full_fp32")),
            ("training.optimizer_in_backward", self.ppo(optimizer_in_backward=True, gradient_accumulation_steps=1)),
            ("training.num_iterations", self.ppo(num_iterations=0)),
            ("peft.base_quantization", self.ppo(peft=quant)),
            ("data.lengths", varlen),
            # the value model trains in the weights' dtype (in full, or PEFT's fp16 score head): GradScaler refuses
            ("training.precision", self.ppo(peft=self.LORA, value_model="peft", precision="fp16_autocast")),
            ("training.precision", self.ppo(peft=self.LORA, precision="fp16_autocast")),
        ]
        for field, c in cases:
            self.assertIn(field, refused(c), field)
        self.assertEqual(refused(self.ppo()), [])
        self.assertEqual(refused(self.ppo(peft=head)), [])  # lm_head adapters on the policy alone are reproduced


class PeftTranslation(unittest.TestCase):
    def peft(self, **kw):
        p = {"method": "lora", "lora_rank": 16, "lora_alpha": 32.0, "lora_dropout": 0.05,
             "target_modules": "q_proj, v_proj", "adapter_dtype": "fp32", "base_quantization": "none"}
        p.update(kw)
        c = config()
        c["peft"] = p
        return c

    def test_lora(self):
        plan = tr.translate(self.peft())
        p = plan["peft"]
        self.assertEqual((p["r"], p["lora_alpha"], p["lora_dropout"], p["use_dora"]), (16, 32.0, 0.05, False))
        self.assertEqual(p["target_modules"], ["q_proj", "v_proj"])
        self.assertEqual(p["adapter_dtype"], "float32")
        self.assertIsNone(p["quantization"])
        self.assertEqual(plan["requires"], ["peft"])
        self.assertEqual(plan["expected_adapter_params"], 16 * 16 * (2048 + 2048 + 2048 + 512))

    def test_dora_all_linear_bf16(self):
        plan = tr.translate(self.peft(method="dora", target_modules="all-linear", adapter_dtype="bf16", lora_rank=8))
        p = plan["peft"]
        self.assertTrue(p["use_dora"])
        self.assertEqual(p["target_modules"], "all-linear")
        self.assertEqual(p["adapter_dtype"], "bfloat16")
        per_layer = 8 * (4096 + 2560 + 2560 + 4096 + 3 * 10240) + (2048 + 512 + 512 + 2048 + 8192 + 8192 + 2048)
        self.assertEqual(plan["expected_adapter_params"], 16 * per_layer)

    def test_qlora(self):
        plan = tr.translate(self.peft(base_quantization="nf4", double_quantization=True))
        q = plan["peft"]["quantization"]
        self.assertEqual((q["type"], q["bits"], q["double_quant"], q["compute_dtype"], q["prepare_kbit"]),
                         ("nf4", 4, True, "bfloat16", True))
        self.assertEqual(q["skip_modules"], ["lm_head"])
        self.assertIn("bitsandbytes", plan["requires"])
        q = tr.translate(self.peft(base_quantization="int8", prepare_kbit=False))["peft"]["quantization"]
        self.assertEqual((q["bits"], q["prepare_kbit"]), (8, False))
        c = self.peft(base_quantization="fp4")
        c["training"]["precision"] = "amp_fp16"
        self.assertEqual(tr.translate(c)["peft"]["quantization"]["compute_dtype"], "float16")

    def test_peft_refusals(self):
        self.assertIn("peft.base_quantization", refused(self.peft(method="none", base_quantization="nf4")))
        self.assertIn("peft.double_quantization", refused(self.peft(double_quantization=True)))
        self.assertIn("peft.target_modules", refused(self.peft(target_modules="query_key_value")))
        self.assertIn("peft.method", refused(self.peft(method="ia3")))
        self.assertIn("peft.lora_rank", refused(self.peft(lora_rank=0)))
        self.assertIn("peft.adapter_dtype", refused(self.peft(adapter_dtype="fp8")))
        self.assertIn("peft.rank", refused(self.peft(rank=8)))
        self.assertIn("training.loss", refused(dict(self.peft(target_modules="q_proj,lm_head"),
                                                    training=dict(config()["training"], loss="fused_linear"))))
        moe = {"model_type": "qwen3_moe", "hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 16,
               "num_key_value_heads": 4, "head_dim": 64, "intermediate_size": 3072, "moe_intermediate_size": 512,
               "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 1000}
        c = self.peft(target_modules="all-linear")
        c["model"] = moe
        self.assertIn("peft.target_modules", refused(c))
        c = self.peft(target_modules="q_proj,v_proj", base_quantization="nf4")
        c["model"] = moe
        self.assertEqual(refused(c), ["peft.base_quantization"])
        c["peft"]["base_quantization"] = "none"
        self.assertEqual(refused(c), [])

    def test_absent_peft_section_is_none(self):
        self.assertIsNone(tr.translate(config())["peft"])
        self.assertEqual(tr.translate(config())["expected_adapter_params"], 0)


class Inputs(unittest.TestCase):
    def test_formats(self):
        c = config()
        self.assertEqual(len(tr.parse_items(json.dumps(c))), 1)
        self.assertEqual(len(tr.parse_items(json.dumps([c, c]))), 2)
        self.assertEqual(len(tr.parse_items(json.dumps(c) + "\n\n" + json.dumps(c) + "\n")), 2)
        self.assertEqual(len(tr.parse_items(json.dumps({"comment": "x", "configs": [c, c, c]}))), 3)
        with self.assertRaises(ValueError):
            tr.parse_items("{\n")

    def test_ids(self):
        cid, cfg, extra = tr.unwrap({"id": "case-1", "confidence": "high", "config": config()})
        self.assertEqual((cid, extra["confidence"]), ("case-1", "high"))
        self.assertEqual(tr.translate({"id": "case-1", "config": config()})["id"], "case-1")
        a, b = tr.default_id(config()), tr.default_id(config())
        self.assertEqual(a, b)
        self.assertTrue(a.startswith("calib-llama-3.2-1b-shape-bf16_pure-adamw-"), a)
        self.assertNotEqual(a, tr.default_id(config(micro_batch_size=3)))

    def test_validation_case_files_translate_or_name_fields(self):
        d = os.path.join(REPO, "tests", "validation", "cases")
        if not os.path.isdir(d):
            self.skipTest("no tests/validation/cases")
        for name in sorted(os.listdir(d)):
            with open(os.path.join(d, name)) as f:
                case = json.load(f)
            plan, err = tr.try_translate(case)
            self.assertTrue(plan or (err and err.fields), name)
            if plan:
                self.assertEqual(plan["id"], case["id"])


class Sweep(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.items = tr.load_items(SWEEP)
        cls.plans = [tr.translate(i) for i in cls.items]

    def test_size_and_ids(self):
        self.assertGreaterEqual(len(self.items), 24)
        ids = [p["id"] for p in self.plans]
        self.assertEqual(len(ids), len(set(ids)))
        for i in self.items:
            self.assertTrue(i.get("comment"), i["id"])
        with open(SWEEP) as f:
            self.assertIn("min", json.load(f)["comment"])  # the time estimate

    def test_covers_every_component(self):
        P = self.plans
        got = lambda f: {f(p) for p in P}  # noqa: E731
        self.assertTrue({"fp32", "amp_bf16", "bf16_pure"} <= got(lambda p: p["precision"]))
        opts = got(lambda p: (p["optimizer"]["name"], p["optimizer"]["impl"]))
        self.assertTrue({("adamw", "foreach"), ("adamw", "fused"), ("sgd", "foreach")} <= opts, opts)
        self.assertIn("adafactor", {o for o, _ in opts})
        self.assertTrue({"none", "full"} <= got(lambda p: p["checkpointing"]["mode"]))
        self.assertTrue({"eager", "sdpa"} <= got(lambda p: p["attn_implementation"]))
        self.assertTrue({"hf_fp32_upcast", "chunked_fp32"} <= got(lambda p: p["loss"]["impl"]))
        self.assertTrue(any(p["peft"] for p in P))
        self.assertTrue(any(p["effective_model"]["num_experts"] for p in P))
        sizes = [p["expected_params"] for p in P]
        self.assertLess(min(sizes), 0.6e9)
        self.assertGreater(max(sizes), 7.5e9)
        self.assertGreater(len(got(lambda p: p["batch"]["micro_batch_size"])), 2)
        self.assertGreater(len(got(lambda p: p["batch"]["sequence_length"])), 2)

    def test_memsim_accepts_every_config(self):
        if not HAVE_CLI:
            self.skipTest(f"memsim-cli not built at {CLI}")
        for item, plan in zip(self.items, self.plans):
            pred = compare.run_memsim(CLI, item["config"])
            if pred.get("peft_unsupported"):
                continue  # this memsim build does not read the peft section yet
            self.assertTrue(pred.get("ok"), f"{item['id']}: {pred.get('error')}")
            self.assertEqual(pred["params_total"], plan["expected_params"] + plan["expected_adapter_params"],
                             item["id"])
            dev = pred["devices"][0]
            self.assertTrue(dev["fits"], item["id"])
            self.assertLess(dev["peak"]["device_bytes"], 72 << 30, item["id"])  # room on an 80 GB H100


class MemsimTables(unittest.TestCase):
    def test_defaults_match_memsim_cli(self):
        if not HAVE_CLI:
            self.skipTest(f"memsim-cli not built at {CLI}")
        out = json.loads(subprocess.run([CLI, "config"], capture_output=True, text=True, check=True).stdout)
        for section, fields in tr.MEMSIM_DEFAULTS.items():
            if section not in out:
                self.assertEqual(section, "peft", f"memsim-cli config has no {section} section")
                continue
            self.assertEqual(set(out[section]), set(fields), section)
            for k, v in fields.items():
                self.assertEqual(out[section][k], v, f"{section}.{k}")
        self.assertEqual(set(out["model"]), set(tr.MEMSIM_MODEL_FIELDS))

    def test_frameworks_match_source(self):
        import re
        path = os.path.join(REPO, "src", "core", "frameworks.cpp")
        if not os.path.exists(path):
            self.skipTest("src/core/frameworks.cpp not found")
        with open(path) as f:
            src = f.read()
        pat = r'\{"(%s)",\s*"[^"]*",\s*"(\w+)",\s*"(\w+)",\s*"(\w+)",\s*"(\w+)",\s*(\d+),\s*(true|false)'
        for fw, spec in tr.FRAMEWORKS.items():
            m = re.search(pat % fw, src)
            self.assertIsNotNone(m, fw)
            self.assertEqual(
                (m.group(2), m.group(3), m.group(4), m.group(5), int(m.group(6)), m.group(7) == "true"),
                (spec["attention"], spec["norm_impl"], spec["loss"], spec["optimizer_impl"], spec["param_groups"],
                 spec["holds_logits"]), fw)


@unittest.skipUnless(HAVE_TRANSFORMERS, "transformers is not installed: AutoConfig checks skipped")
class WithTransformers(unittest.TestCase):
    def test_autoconfig_accepts_every_sweep_config(self):
        from transformers import AutoConfig
        for item in tr.load_items(SWEEP):
            plan = tr.translate(item)
            cfg = AutoConfig.for_model(plan["model_type"], **plan["hf_config"])
            em = plan["effective_model"]
            self.assertEqual(cfg.hidden_size, em["hidden_size"])
            self.assertEqual(cfg.num_key_value_heads, em["num_key_value_heads"])
            self.assertEqual(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
                             em["head_dim"])
            self.assertFalse(cfg.use_cache)
            if plan["model_type"] == "mixtral":
                self.assertEqual(cfg.num_local_experts, em["num_experts"])
            if plan["model_type"] == "qwen3_moe":
                self.assertEqual(cfg.num_experts, em["num_experts"])


class Records(unittest.TestCase):
    def fake(self):
        plan = tr.translate({"id": "calib-test", "config": config(loss="chunked_fp32")})
        meas = {"stats": {"allocated": 10 << 30, "reserved": 11 << 30, "active": 10 << 30, "requested": 9 << 30,
                          "device": None},
                "params_total": plan["expected_params"], "params_trainable": plan["expected_params"],
                "diagnostics": {"losses": [12.0]}, "notes": ["x"]}
        env = {"date": "2025-01-01", "gpu": "NVIDIA H100 80GB HBM3", "memsim_gpu": "h100-sxm",
               "total_memory_bytes": 85 << 30, "driver": "550.54", "cuda": "12.4",
               "versions": {"torch": "2.5.1", "transformers": "4.47.0", "peft": "0.13.2"}}
        return plan, calibrate.make_record(plan, config(loss="chunked_fp32"), meas, env)

    def test_record_format(self):
        plan, rec = self.fake()
        for k in ("id", "kind", "confidence", "source", "model", "training", "hardware", "measured",
                  "inferred_fields", "notes", "memsim_config", "also_measured", "versions"):
            self.assertIn(k, rec)
        self.assertEqual((rec["kind"], rec["confidence"]), ("measured", "high"))
        m = rec["measured"]
        self.assertEqual((m["unit"], m["bytes"], m["gib"], m["value"], m["statistic"]),
                         ("GiB", 10 << 30, 10.0, 10.0, "allocated"))
        self.assertIn("max_memory_allocated", m["quantity"])
        self.assertIn("never reset", m["quantity"])
        self.assertEqual(set(rec["also_measured"]), {"reserved", "active", "requested", "device"})
        self.assertIsNone(rec["also_measured"]["device"])
        self.assertIn("active_bytes.all.peak", rec["also_measured"]["active"]["quantity"])
        self.assertIn("calibrate.py", rec["source"]["path"])
        self.assertEqual(rec["hardware"]["gpu"], "NVIDIA H100 80GB HBM3")
        self.assertEqual(rec["versions"]["peft"], "0.13.2")
        self.assertEqual(rec["memsim_config"], config(loss="chunked_fp32"))
        self.assertIn("not reset", rec["peak_note"])
        json.dumps(rec)

    def test_record_keys_match_shared_cases(self):
        if not os.path.exists(SHARED_CASES):
            self.skipTest("../shared/validation/cases.jsonl not found")
        with open(SHARED_CASES) as f:
            ref = json.loads(f.readline())
        _, rec = self.fake()
        self.assertTrue(set(ref) <= set(rec), set(ref) - set(rec))
        for k in ("value", "unit", "bytes", "gib", "quantity"):
            self.assertIn(k, rec["measured"])

    def test_helpers(self):
        self.assertEqual(calibrate.parse_nvidia_smi_used("1234\n"), 1234 << 20)
        self.assertIsNone(calibrate.parse_nvidia_smi_used("N/A"))
        self.assertEqual(calibrate.nvml_device_selector({}), 0)
        self.assertEqual(calibrate.nvml_device_selector({"CUDA_VISIBLE_DEVICES": "3,1"}), 3)
        self.assertEqual(calibrate.nvml_device_selector({"CUDA_VISIBLE_DEVICES": "GPU-abc"}), "GPU-abc")
        self.assertEqual(calibrate.memsim_gpu_for("NVIDIA H100 80GB HBM3"), "h100-sxm")
        self.assertEqual(calibrate.memsim_gpu_for("NVIDIA H100 PCIe"), "h100-pcie")
        self.assertEqual(calibrate.memsim_gpu_for("NVIDIA H200"), "h200")
        self.assertEqual(calibrate.memsim_gpu_for("NVIDIA A100-SXM4-80GB", 85 << 30), "a100-80gb")
        self.assertEqual(calibrate.memsim_gpu_for("NVIDIA A100-SXM4-40GB", 42 << 30), "a100-40gb")
        self.assertIsNone(calibrate.memsim_gpu_for("Some GPU"))
        self.assertEqual(calibrate.failure_record("x", "boom", "training.compile")["kind"], "failed")

    def test_dry_run_cli(self):
        p = subprocess.run([sys.executable, os.path.join(HERE, "calibrate.py"), SWEEP, "--dry-run", "--cli",
                            "/nonexistent/memsim-cli"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("configs valid", p.stdout)


class Compare(unittest.TestCase):
    def rec(self):
        return Records().fake()[1]

    def test_measured_stats_and_config_gpu(self):
        rec = self.rec()
        self.assertEqual(compare.measured_stats(rec), {"allocated": 10 << 30, "reserved": 11 << 30,
                                                        "active": 10 << 30, "requested": 9 << 30})
        rec["memsim_config"]["hardware"]["gpu"] = "a100-80gb"
        self.assertEqual(compare.config_for(rec)["hardware"]["gpu"], "h100-sxm")
        self.assertEqual(compare.config_for(rec, config_gpu=True)["hardware"]["gpu"], "a100-80gb")
        self.assertEqual(rec["memsim_config"]["hardware"]["gpu"], "a100-80gb")  # not modified

    def test_summary(self):
        rows = [{"id": "a", "error": None, "stats": {"allocated": {"measured": 100, "predicted": 110, "error": 0.1}}},
                {"id": "b", "error": None, "stats": {"allocated": {"measured": 100, "predicted": 70, "error": -0.3}}},
                {"id": "c", "error": None, "stats": {"allocated": {"measured": 100, "predicted": 95, "error": -0.05}}},
                {"id": "d", "error": "rejected", "stats": {}}]
        s = compare.summarize(rows)
        self.assertEqual(s["allocated"]["n"], 3)
        self.assertAlmostEqual(s["allocated"]["median_abs_error"], 0.1)
        self.assertEqual((s["allocated"]["worst_id"], s["allocated"]["worst_error"]), ("b", -0.3))
        buf = io.StringIO()
        compare.print_report(rows, s, out=buf)
        self.assertIn("-30.0%", buf.getvalue())
        self.assertIn("median absolute error 10.0%", buf.getvalue())
        self.assertIn("memsim could not simulate it: rejected", buf.getvalue())

    def test_end_to_end_with_cli(self):
        if not HAVE_CLI:
            self.skipTest(f"memsim-cli not built at {CLI}")
        with tempfile.TemporaryDirectory() as d:
            results = os.path.join(d, "r.jsonl")
            with open(results, "w") as f:
                f.write(json.dumps(self.rec()) + "\n")
                f.write(json.dumps({"id": "x", "kind": "failed"}) + "\n")
            p = subprocess.run([sys.executable, os.path.join(HERE, "compare.py"), results, "--cli", CLI, "--json",
                                os.path.join(d, "c.json"), "--emit-cases", os.path.join(d, "cases")],
                               capture_output=True, text=True)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("calib-test", p.stdout)
            self.assertIn("median absolute error", p.stdout)
            with open(os.path.join(d, "c.json")) as f:
                c = json.load(f)
            self.assertEqual(set(c["rows"][0]["stats"]), {"allocated", "reserved", "active", "requested"})
            v = subprocess.run([CLI, "validate", os.path.join(d, "cases")], capture_output=True, text=True)
            self.assertEqual(v.returncode, 0, v.stderr)
            self.assertIn("calib-test", v.stdout)

    def test_missing_cli_or_file(self):
        with tempfile.TemporaryDirectory() as d:
            results = os.path.join(d, "r.jsonl")
            with open(results, "w") as f:
                f.write(json.dumps(self.rec()) + "\n")
            with contextlib.redirect_stderr(io.StringIO()) as err:
                self.assertEqual(compare.main([results, "--cli", os.path.join(d, "nope")]), 2)
                self.assertEqual(compare.main([os.path.join(d, "missing.jsonl"), "--cli", CLI]), 2)
            self.assertIn("memsim-cli not found", err.getvalue())


class BnbVersion(unittest.TestCase):
    def test_saves_input_before_0_43_2(self):
        import calibrate
        self.assertTrue(calibrate.bnb_saves_input("0.41.1"))
        self.assertTrue(calibrate.bnb_saves_input("0.43.1"))
        self.assertFalse(calibrate.bnb_saves_input("0.43.2"))
        self.assertFalse(calibrate.bnb_saves_input("0.45.0.dev0"))


class Trace(unittest.TestCase):
    def test_convert_renumbers_blocks_and_totals_the_peaks(self):
        import alloc_trace as tracemod
        ev = [["segment_alloc", 1000, 2097152, 0], ["alloc", 1000, 600, 0], ["alloc", 1600, 100, 0],
              ["free_requested", 1000, 600, 0], ["free_completed", 1000, 600, 0], ["alloc", 1000, 50, 0],
              ["segment_alloc", 5000, 20971520, 0], ["alloc", 5000, 2000000, 0]]
        text = tracemod.convert({"events": ev}, "unit")
        lines = text.splitlines()
        self.assertIn("# reserved_peak_bytes 23068672", lines)
        self.assertIn("# allocated_peak_bytes 2000150", lines)
        self.assertEqual(lines[4:], ["s 0 2097152", "a 0 600", "a 1 100", "f 0", "a 2 50", "s 4000 20971520",
                                     "a 3 2000000"])

    def test_a_trace_that_releases_segments_is_refused(self):
        import alloc_trace as tracemod
        with self.assertRaises(ValueError):
            tracemod.convert({"events": [["segment_alloc", 0, 2097152, 0], ["segment_free", 0, 2097152, 0]]}, "x")

    def test_an_expandable_segments_trace_is_refused(self):
        import alloc_trace as tracemod
        with self.assertRaises(ValueError):
            tracemod.convert({"events": [["segment_map", 0, 20971520, 0], ["alloc", 0, 600, 0]]}, "x")


if __name__ == "__main__":
    unittest.main()
