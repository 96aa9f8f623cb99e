"""Model programs in the calibration harness, without torch: translation, the fields it refuses, and the program
expressions it evaluates (block instances, input shapes). Run: python3 -m unittest discover -s tools/calibrate."""

import glob
import json
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import programs  # noqa: E402
import translate as tr  # noqa: E402

CLI = os.path.join(HERE, "..", "..", "build", "native", "memsim-cli")


def program_config(architecture, args="", **training):
    t = {"micro_batch_size": 2, "precision": "fp32", "framework": "hf_loop", "activation_checkpointing": "none",
         "optimizer": "adamw", "optimizer_impl": "foreach"}
    t.update(training)
    return {"schema": 2, "model": {"architecture": architecture, "architecture_args": args}, "training": t,
            "parallel": {"data_parallel_size": 1, "zero_stage": 0}, "hardware": {"gpu": "h100-sxm"}}


def refused_fields(config):
    plan, err = tr.try_translate(config)
    return None if err is None else err.fields


class Translation(unittest.TestCase):
    def test_torchvision_families_translate_at_their_defaults(self):
        # ResNet-50: 3 + 4 + 6 + 3 bottlenecks; ConvNeXt-T: 3 + 3 + 9 + 3 blocks and 3 downsampling layers; Swin-T:
        # 1 + 1 + 3 + 1 plain/shifted pairs and 3 patch mergings; ResNet-18: 2 + 2 + 2 + 2
        for name, blocks in (("resnet", 16), ("convnext", 21), ("swin", 9), ("resnet_basic", 8), ("vit_torchvision", 12)):
            plan, err = tr.try_translate(program_config(name))
            self.assertIsNone(err, name)
            prog = plan["program_plan"]
            self.assertEqual(plan["kind"], "program")
            self.assertEqual(prog["block_instances"], blocks, name)
            self.assertEqual(list(prog["inputs"].values()), [[3, 224, 224]], name)
            self.assertEqual(prog["library"], "torchvision")
            self.assertEqual(prog["attention"], "own")

    def test_arguments_apply_and_unknown_ones_are_refused(self):
        plan, _ = tr.try_translate(program_config("resnet", "layers3=23, image_size=160"))
        self.assertEqual(plan["program_plan"]["args"]["layers3"], 23)
        self.assertEqual(plan["program_plan"]["inputs"]["pixel_values"], [3, 160, 160])
        self.assertEqual(plan["program_plan"]["block_instances"], 33)
        self.assertEqual(refused_fields(program_config("resnet", "depth9=1")), ["model.architecture_args"])
        self.assertEqual(refused_fields(program_config("resnet", "layers1=many")), ["model.architecture_args"])
        self.assertEqual(refused_fields(program_config("resnet", "num_channels=1")), ["model.architecture_args"])
        self.assertEqual(refused_fields(program_config("swin", "depth3=5")), ["model.architecture_args"])

    def test_programs_the_harness_does_not_build_are_refused_by_name(self):
        for name in ("vit_timm", "whisper", "flux_dit", "mamba2", "qwen2_vl_vision", "no_such_program"):
            self.assertEqual(refused_fields(program_config(name)), ["model.architecture"], name)
        inline = program_config("resnet")
        inline["model"]["architecture"] = {"name": "mine"}
        self.assertEqual(refused_fields(inline), ["model.architecture"])

    def test_settings_it_cannot_reproduce_name_their_fields(self):
        cases = [
            ({"precision": "bf16_pure"}, "training.precision"),
            ({"activation_checkpointing": "every_k"}, "training.activation_checkpointing"),
            ({"checkpoint_reentrant": "true"}, "training.checkpoint_reentrant"),
            ({"attention": "sdpa"}, "training.attention"),
        ]
        for training, field in cases:
            self.assertIn(field, refused_fields(program_config("convnext", **training)), training)
        lora = program_config("convnext")
        lora["peft"] = {"method": "lora"}
        self.assertIn("peft.method", refused_fields(lora))
        vlm = program_config("resnet")
        vlm["model"]["vision_tower"] = "clip_vision"
        self.assertIn("model.vision_tower", refused_fields(vlm))
        sharded = program_config("resnet")
        sharded["parallel"]["zero_stage"] = 3
        self.assertIn("parallel.zero_stage", refused_fields(sharded))

    def test_transformers_classifiers_translate_with_memsims_attention_and_their_fixed_keys(self):
        plan, err = tr.try_translate(program_config("dinov2_swiglu", "input_image_size=518,num_labels=10",
                                                    activation_checkpointing="full"))
        self.assertIsNone(err)
        prog = plan["program_plan"]
        self.assertEqual((prog["library"], prog["attention"], prog["num_classes"]), ("transformers", "sdpa", 10))
        self.assertEqual(prog["fixed"], {"use_swiglu_ffn": True})
        self.assertEqual(prog["inputs"], {"pixel_values": [3, 518, 518]})
        self.assertEqual(prog["block_instances"], 12)
        self.assertIn("gradient_checkpointing_enable", prog["checkpointing"]["how"])
        self.assertEqual(plan["requires"], ["transformers"])
        plan, _ = tr.try_translate(program_config("clip_vision", attention="eager"))
        self.assertEqual((plan["program_plan"]["attention"], plan["program_plan"]["fixed"]),
                         ("eager", {"hidden_act": "quick_gelu"}))
        self.assertIn("training.attention", refused_fields(program_config("vit", attention="flash_attention_2")))
        self.assertIn("model.architecture_args", refused_fields(program_config("clip_vision", "anyres=1")))

    def test_transformers_configs_carry_the_programs_keys(self):
        # transformers is not installed here: a stand-in module records what each config class is given
        class Recorder(dict):
            def __init__(self, **kw):
                super().__init__(kw)

        fake = type(sys)("transformers")
        for cls in ("ViTConfig", "Dinov2Config", "CLIPConfig", "SiglipConfig"):
            setattr(fake, cls, type(cls, (Recorder,), {}))
        saved = sys.modules.get("transformers")
        sys.modules["transformers"] = fake
        try:
            vit = programs._hf_config(tr.translate(program_config("vit", "qkv_bias=0,num_labels=5"))["program_plan"])
            sig = programs._hf_config(tr.translate(program_config("siglip_vision"))["program_plan"])
        finally:
            if saved is None:
                del sys.modules["transformers"]
            else:
                sys.modules["transformers"] = saved
        self.assertEqual(type(vit).__name__, "ViTConfig")
        self.assertEqual((vit["qkv_bias"], vit["hidden_act"], vit["num_labels"], vit["image_size"]),
                         (False, "gelu", 5, 224))
        self.assertEqual(vit["problem_type"], "single_label_classification")
        self.assertEqual(type(sig).__name__, "SiglipConfig")
        self.assertEqual(sig["vision_config"]["hidden_act"], "gelu_pytorch_tanh")
        self.assertTrue(sig["vision_config"]["vision_use_head"])
        self.assertNotIn("num_labels", sig["vision_config"])

    def test_full_checkpointing_and_amp_translate(self):
        plan, err = tr.try_translate(program_config("swin", precision="amp_bf16", activation_checkpointing="full"))
        self.assertIsNone(err)
        self.assertEqual(plan["autocast_dtype"], "bfloat16")
        self.assertEqual(plan["checkpointing"]["mode"], "full")
        self.assertFalse(plan["checkpointing"]["use_reentrant"])


class Expressions(unittest.TestCase):
    def test_every_catalogue_program_evaluates(self):
        # The harness reads block counts and input shapes from each program's own expressions; every program the
        # catalogue ships (the families the harness builds later among them) must evaluate at its defaults.
        for path in sorted(glob.glob(os.path.join(programs.ARCH_DIR, "*.json"))):
            with open(path, encoding="utf-8") as f:
                program = json.load(f)
            args = program["hyperparameters"]
            counts = programs.block_instances(program, args)
            self.assertTrue(all(n >= 0 for _, n in counts), path)
            shapes = programs.input_shapes(program, args)
            self.assertTrue(all(all(d > 0 for d in s) for s in shapes.values()), path)

    def test_operators(self):
        names = {"a": 7, "b": 2}
        self.assertEqual(programs.evaluate("a // b + a % b", names), 4)
        self.assertEqual(programs.evaluate("(2 * a - 1) ^ 2", names), 169)
        self.assertEqual(programs.evaluate("min(max(a - 8, 0), 1)", names), 0)
        with self.assertRaises(programs.ProgramError):
            programs.evaluate("__import__('os')", names)
        with self.assertRaises(programs.ProgramError):
            programs.evaluate("c + 1", names)


@unittest.skipUnless(os.path.exists(CLI), "memsim-cli is not built")
class AgainstMemsim(unittest.TestCase):
    def test_memsim_accepts_every_translated_program_config(self):
        for name in programs.FAMILIES:
            config = program_config(name, precision="amp_bf16", activation_checkpointing="full")
            self.assertIsNone(tr.try_translate(config)[1])
            out = subprocess.run([CLI, "estimate", "--config", "-"], input=json.dumps(config), capture_output=True,
                                 text=True, timeout=60)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertGreater(json.loads(out.stdout)["devices"][0]["forward_retained_bytes"], 0)

    def test_the_gpu_sweep_translates_and_memsim_accepts_it(self):
        with open(os.path.join(HERE, "sweep_programs.json"), encoding="utf-8") as f:
            items = tr.parse_items(f.read())
        self.assertGreaterEqual(len(items), 6)
        for item in items:
            plan, err = tr.try_translate(item)
            self.assertIsNone(err, item["id"])
            out = subprocess.run([CLI, "estimate", "--config", "-"], input=json.dumps(item["config"]),
                                 capture_output=True, text=True, timeout=60)
            self.assertEqual(out.returncode, 0, item["id"] + ": " + out.stderr)


if __name__ == "__main__":
    unittest.main()
