"""The calibration harness for memsim's model programs (src/core/catalog/architectures/*.json): the image
classifiers torchvision builds (ResNet, ConvNeXt, Swin, ViT) and transformers' (ViT, DINOv2, CLIP's and SigLIP's vision
towers as classifiers), translated from a memsim config, built with random weights, trained on random images, and
(torchvision's, on the CPU) their forward's saved set measured on torch's autograd graph. The transformers builders
run only where transformers is installed (a GPU machine; Debian has none) and have not run yet.

translate.py calls translate_program() for a config whose model.architecture names a program; it needs no torch.
The builders import torch and torchvision inside the functions, so this file's translation is tested on machines
without them (test_programs.py); check_programs_torch.py runs the builders on CPU where Debian's python3-torch and
python3-torchvision are installed.

What a CPU run measures (saved_set_bytes): after one forward and the loss, every tensor the autograd graph's nodes
hold (their _saved_* attributes), each storage once, parameters and buffers left out, each rounded to the caching
allocator's 512 bytes. That is the activation memory a CUDA run holds between forward and backward, up to what the
CPU kernels save differently from the CUDA ones (batch norm's per-channel statistics: a few KiB). memsim's figure
is forward_retained_bytes (memsim-cli's JSON): what its step-2 forward leaves allocated for backward, each tensor
rounded the same way, which also holds the collated batch (images and int64 labels, one allocation) and the loss;
run_cpu adds those to the graph's set. Both leave out how the caching allocator splits its blocks.

Families the program catalogue has but the harness does not build yet (timm's ViT, Whisper, the diffusion models,
Mamba-2 and the hybrids, the towers without a head) are refused by name: docs/research/calibrate-programs.md says
what each needs.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
ARCH_DIR = os.path.join(HERE, "..", "..", "src", "core", "catalog", "architectures")
ROUND = 512  # CUDACachingAllocator rounds every block to 512 bytes (kMinBlockSize)


def rounded(n):
    """Bytes as the caching allocator rounds a request (CachingAllocator::round_size; a 0-byte tensor takes none)."""
    return -(-n // ROUND) * ROUND


def resolve(path):
    """The object a dotted path names ("torch.optim.AdamW")."""
    mod, _, name = path.rpartition(".")
    return getattr(__import__(mod, fromlist=[name]), name)


class ProgramError(Exception):
    """A program setting the harness cannot reproduce: (field, message)."""

    def __init__(self, field, message):
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


# ---------------------------------------------------------------------------------------------------------------
# The program's JSON, torch-free
# ---------------------------------------------------------------------------------------------------------------

def load_program(name):
    if not isinstance(name, str) or not name.replace("_", "").isalnum() \
            or not os.path.exists(os.path.join(ARCH_DIR, name + ".json")):
        raise ProgramError("model.architecture", f"{name!r} is not a catalogue program (src/core/catalog/"
                           "architectures); an inline program has no library class to build")
    with open(os.path.join(ARCH_DIR, name + ".json"), encoding="utf-8") as f:
        return json.load(f)


def program_args(program, text):
    """The program's hyperparameters with "k=v,k=v" (model.architecture_args, memsim's format) applied."""
    args = dict(program["hyperparameters"])
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in args:
            raise ProgramError("model.architecture_args", f"{item!r}: {program['name']} takes "
                               + ", ".join(f"{k}=" for k in args))
        try:
            args[key] = float(value) if "." in value or "e" in value.lower() else int(value)
        except ValueError:
            raise ProgramError("model.architecture_args", f"{item!r}: a number") from None
    return args


_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
           ast.BitXor: lambda a, b: a ** b}  # memsim's expressions write powers as ^ (docs/extending.md)


_CALLS = {"min": min, "max": max, "sqrt": lambda x: x ** 0.5, "round": round,  # Python's: half to even, as memsim's
          "if_": lambda c, a, b: a if c != 0 else b}


def evaluate(expr, names):
    """One of the program's size expressions ("depth1 // 2", "min(x, 1)") over its hyperparameters and dims."""
    if isinstance(expr, (int, float)):
        return expr

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.Name) and node.id in names:
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS:
            return _CALLS[node.func.id](*(ev(a) for a in node.args))
        raise ProgramError("model.architecture", f"the expression {expr!r} uses what the harness does not evaluate")

    try:  # "if" is a Python keyword: memsim's if(c, a, b) is read as a call of if_
        tree = ast.parse(str(expr).replace("if(", "if_("), mode="eval")
    except SyntaxError:
        raise ProgramError("model.architecture", f"the expression {expr!r} does not parse") from None
    return ev(tree)


def dims_of(program, args):
    """The hyperparameters and the program's dims, which may name each other in any order (docs/extending.md)."""
    names, pending = dict(args), dict(program.get("dims", {}))
    while pending:
        done = {}
        for k, expr in pending.items():
            try:
                done[k] = evaluate(expr, names)
            except ProgramError:
                continue  # names a dim not evaluated yet
        if not done:
            raise ProgramError("model.architecture", f"dims {', '.join(sorted(pending))} cannot be evaluated")
        names.update(done)
        pending = {k: v for k, v in pending.items() if k not in done}
    return names


def block_instances(program, args):
    """How many block instances memsim runs (the units a checkpoint wraps), in order: [(block name, count)]."""
    names = dims_of(program, args)
    if "blocks" in program:
        return [(b.get("name") or b["same_as"], int(evaluate(b.get("repeat", 1), names))) for b in program["blocks"]]
    return [("block", int(evaluate(program["repeat"], names)))]


def input_shapes(program, args):
    names = dims_of(program, args)
    return {k: [int(evaluate(d, names)) for d in v["shape"]] for k, v in program["inputs"].items()}


# ---------------------------------------------------------------------------------------------------------------
# Families: how torchvision builds each program (the programs cite torchvision v0.16.0; the constructors and
# parameter shapes are the same in 0.14, Debian 12's, which check_programs_torch.py checks against the counts)
# ---------------------------------------------------------------------------------------------------------------

def _resnet(args, bottleneck):
    from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet
    layers = [args["layers1"], args["layers2"], args["layers3"], args["layers4"]]
    if bottleneck:
        return ResNet(Bottleneck, layers, num_classes=args["num_classes"], groups=args["groups"],
                      width_per_group=args["width_per_group"])
    return ResNet(BasicBlock, layers, num_classes=args["num_classes"])


def _resnet_units(model):
    return [[blk] for layer in (model.layer1, model.layer2, model.layer3, model.layer4) for blk in layer]


def _convnext(args):
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    d = args["dim1"]
    stages = [CNBlockConfig(d, 2 * d, args["depth1"]), CNBlockConfig(2 * d, 4 * d, args["depth2"]),
              CNBlockConfig(4 * d, 8 * d, args["depth3"]), CNBlockConfig(8 * d, None, args["depth4"])]
    return ConvNeXt(stages, stochastic_depth_prob=args["stochastic_depth_prob"], num_classes=args["num_classes"])


def _convnext_units(model):
    units = []
    for i in range(1, 8):  # features[1, 3, 5, 7]: the stages' blocks; features[2, 4, 6]: the downsampling layers
        units += [[blk] for blk in model.features[i]] if i % 2 else [[model.features[i]]]
    return units


def _swin(args):
    from torchvision.models.swin_transformer import SwinTransformer
    h = args["num_heads"]
    return SwinTransformer(patch_size=[args["patch_size"]] * 2, embed_dim=args["embed_dim"],
                           depths=[args["depth1"], args["depth2"], args["depth3"], args["depth4"]],
                           num_heads=[h, 2 * h, 4 * h, 8 * h], window_size=[args["window"]] * 2,
                           mlp_ratio=args["mlp_ratio"], stochastic_depth_prob=args["stochastic_depth_prob"],
                           num_classes=args["num_classes"])


def _vit(args):
    from torchvision.models.vision_transformer import VisionTransformer
    return VisionTransformer(image_size=args["image_size"], patch_size=args["patch_size"], num_layers=args["num_layers"],
                             num_heads=args["num_heads"], hidden_dim=args["hidden_dim"], mlp_dim=args["mlp_dim"],
                             dropout=args["dropout"], attention_dropout=args["attention_dropout"],
                             num_classes=args["num_classes"])


def _vit_units(model):
    return [[layer] for layer in model.encoder.layers]


def _swin_units(model):
    units = []
    for i in range(1, 8):  # a program block is a plain and a shifted window block: one checkpoint over the pair
        stage = model.features[i]
        units += [[stage[j], stage[j + 1]] for j in range(0, len(stage), 2)] if i % 2 else [[stage]]
    return units


def _swin_check(args):
    for k in ("depth1", "depth2", "depth3", "depth4"):
        if args[k] % 2:
            raise ProgramError("model.architecture_args", f"{k}={args[k]}: the Swin program's block is a plain and "
                               "a shifted window block, so each depth is even")


def _hf_config(prog):
    """transformers' config for an HF image classifier program: the program's hyperparameters are the config's keys
    (the programs were written from these classes), with what the program fixes (its `requires`) made explicit."""
    import transformers
    program, args = prog["program"], prog["args"]
    kw = {k: v for k, v in args.items() if k not in ("num_labels", "input_image_size", "anyres", "image_height",
                                                       "image_width")}
    if "qkv_bias" in kw:
        kw["qkv_bias"] = bool(kw["qkv_bias"])
    kw.update(prog["fixed"])
    labels = {"num_labels": args["num_labels"], "problem_type": "single_label_classification"}
    if program in ("clip_vision", "siglip_vision"):
        cls = transformers.CLIPConfig if program == "clip_vision" else transformers.SiglipConfig
        return cls(vision_config=kw, **labels)
    if program == "vit":
        kw["hidden_act"] = "gelu"
    return {"vit": transformers.ViTConfig, "dinov2": transformers.Dinov2Config,
            "dinov2_swiglu": transformers.Dinov2Config}[program](**kw, **labels)


def _hf_build(prog):
    import transformers
    return transformers.AutoModelForImageClassification.from_config(_hf_config(prog),
                                                                    attn_implementation=prog["attention"])


def _hf_check(args):
    for k in ("anyres", "image_height", "image_width"):
        if args.get(k):
            raise ProgramError("model.architecture_args", f"{k}={args[k]}: a LLaVA tower's argument; the harness "
                               "trains the tower as an image classifier")


FAMILIES = {
    "resnet": {"library": "torchvision", "class": "torchvision.models.resnet.ResNet(Bottleneck)",
               "build": lambda p: _resnet(p["args"], True), "units": _resnet_units},
    "resnet_basic": {"library": "torchvision", "class": "torchvision.models.resnet.ResNet(BasicBlock)",
                     "build": lambda p: _resnet(p["args"], False), "units": _resnet_units},
    "convnext": {"library": "torchvision", "class": "torchvision.models.convnext.ConvNeXt",
                 "build": lambda p: _convnext(p["args"]), "units": _convnext_units},
    "swin": {"library": "torchvision", "class": "torchvision.models.swin_transformer.SwinTransformer",
             "build": lambda p: _swin(p["args"]), "units": _swin_units, "check": _swin_check},
    "vit_torchvision": {"library": "torchvision", "class": "torchvision.models.vision_transformer.VisionTransformer",
                        "build": lambda p: _vit(p["args"]), "units": _vit_units},
}
# transformers' image classifiers (AutoModelForImageClassification): written from the programs' sources, run only on
# a GPU machine with transformers installed (Debian has none), never yet: no GPU has been lent since.
for _name in ("vit", "dinov2", "dinov2_swiglu", "clip_vision", "siglip_vision"):
    FAMILIES[_name] = {"library": "transformers", "class": f"AutoModelForImageClassification ({_name})",
                       "build": _hf_build, "units": None, "check": _hf_check}
# num_channels is the images' channels; torchvision's stems take 3
FIXED_ARGS = {"num_channels": 3}


# ---------------------------------------------------------------------------------------------------------------
# Translation (called by translate.translate for a config with model.architecture)
# ---------------------------------------------------------------------------------------------------------------

PRECISIONS = {"fp32": ("float32", None), "amp_bf16": ("float32", "bfloat16")}


def translate_program(model, t, pf, errors, notes):
    """The program part of a plan, or None with `errors` appended ((field, message) pairs)."""
    name = model.get("architecture")
    try:
        program = load_program(name)
        fam = FAMILIES.get(name)
        if fam is None:
            raise ProgramError("model.architecture", f"{name}: the harness builds "
                               + ", ".join(sorted(FAMILIES)) + " so far; docs/research/calibrate-programs.md plans "
                               "the others")
        args = program_args(program, model.get("architecture_args", ""))
        for k, want in FIXED_ARGS.items():
            if fam["library"] == "torchvision" and k in args and args[k] != want:
                raise ProgramError("model.architecture_args", f"{k}={args[k]}: torchvision's stem takes {want}")
        if fam.get("check"):
            fam["check"](args)
    except ProgramError as e:
        errors.append((e.field, e.message))
        return None
    for k in ("vision_tower", "vision_tower_args"):
        if model.get(k):
            errors.append((f"model.{k}", "a vision-language model: the harness builds image classifiers"))
    if t["precision"] not in PRECISIONS:
        errors.append(("training.precision", f"{t['precision']}: the harness runs programs in fp32 or amp_bf16 "
                       "(torchvision's convolutions read fp32 images, so bf16_pure would need an input cast memsim "
                       "does not model)"))
    if t["activation_checkpointing"] not in ("none", "full"):
        errors.append(("training.activation_checkpointing", f"{t['activation_checkpointing']}: none or full "
                       "(torch.utils.checkpoint around each program block, non-reentrant)"))
    if t["checkpoint_reentrant"] not in ("auto", False, "false"):
        errors.append(("training.checkpoint_reentrant", "the harness checkpoints non-reentrant: auto or false"))
    hf = fam["library"] == "transformers"
    if hf and t["attention"] not in ("auto", "sdpa", "eager"):
        errors.append(("training.attention", f"{t['attention']}: transformers' vision classifiers run sdpa (auto) "
                       "or eager"))
    elif not hf and t["attention"] not in ("auto", "eager"):
        errors.append(("training.attention", "torchvision's models run their own attention: auto"))
    if t["loss"] != "auto" or t["objective"] != "sft":
        errors.append(("training.loss", "an image classifier's loss is its head's cross_entropy: loss auto, "
                       "objective sft"))
    if pf["method"] != "none":
        errors.append(("peft.method", f"{pf['method']}: the harness trains program families in full (peft's "
                       "LoRA on torchvision modules is not reproduced yet)"))
    if errors:
        return None
    param_dtype, autocast = PRECISIONS[t["precision"]]
    units = block_instances(program, args)
    return {
        "kind": "program",
        "program": name,
        "library": fam["library"],
        "model_class": fam["class"],
        "args": args,
        # what the program fixes (its "requires": Dinov2's use_swiglu_ffn, CLIP's quick_gelu), made explicit
        "fixed": {k: v["equals"] for k, v in program.get("requires", {}).items()},
        # memsim resolves auto to sdpa for these frameworks (frameworks.cpp); torchvision's attention is its own
        "attention": ("sdpa" if t["attention"] == "auto" else t["attention"]) if hf else "own",
        "num_classes": args.get("num_classes", args.get("num_labels")),
        "inputs": input_shapes(program, args),
        "block_instances": sum(n for _, n in units),
        "param_dtype": param_dtype,
        "autocast_dtype": autocast,
        "checkpointing": {"mode": t["activation_checkpointing"], "use_reentrant": False,
                          "how": None if t["activation_checkpointing"] == "none" else
                          "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False})"
                          if hf else "torch.utils.checkpoint.checkpoint around each program block (a Swin pair in "
                          "one)"},
        "loss": "F.cross_entropy(model(pixel_values).logits, labels)" if hf else
                "F.cross_entropy(model(pixel_values), labels)",
    }


# ---------------------------------------------------------------------------------------------------------------
# Running (torch imported here)
# ---------------------------------------------------------------------------------------------------------------

def build(prog_plan, torch):
    torch.manual_seed(0)
    return FAMILIES[prog_plan["program"]]["build"](prog_plan)


def checkpoint_units(model, prog_plan, torch):
    """Wraps each program block in a non-reentrant checkpoint; returns how many units it wrapped."""
    import torch.utils.checkpoint as cp
    if FAMILIES[prog_plan["program"]]["units"] is None:  # transformers: each encoder layer, as memsim's blocks
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return prog_plan["block_instances"]
    units = FAMILIES[prog_plan["program"]]["units"](model)
    for unit in units:
        first, rest = unit[0], unit[1:]
        inner = [m.forward for m in unit]

        def run(x, inner=inner):
            for f in inner:
                x = f(x)
            return x

        first.forward = lambda x, run=run: cp.checkpoint(run, x, use_reentrant=False)
        for m in rest:  # the pair's second block runs inside the first's checkpoint
            m.forward = lambda x: x
    return len(units)


def make_batch(prog_plan, batch_size, torch, dev):
    (shape,) = prog_plan["inputs"].values()
    x = torch.randn(batch_size, *shape, device=dev)  # the collator's fp32 images
    y = torch.randint(0, prog_plan["num_classes"], (batch_size,), device=dev)
    return x, y


def loss_of(model, x, y, torch):
    out = model(x)
    return torch.nn.functional.cross_entropy(getattr(out, "logits", out), y)  # transformers' output holds .logits


def saved_set_bytes(loss, model, torch):
    """Bytes the autograd graph behind `loss` holds for backward: each storage once, parameters and buffers out,
    each rounded to 512 bytes. Reading a node's _saved_* attribute unpacks it, so this runs on graphs without
    checkpoints only (a non-reentrant checkpoint would recompute its block)."""
    skip = {p.data_ptr() for p in model.parameters()} | {b.data_ptr() for b in model.buffers()}
    storages, seen, stack = {}, set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for attr in dir(node):
            if not attr.startswith("_saved_"):
                continue
            try:
                value = getattr(node, attr)
            except Exception:  # a saved tensor already freed, or a non-tensor attribute that cannot be read
                continue
            for t in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(t, torch.Tensor):
                    s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
                    if s.data_ptr() not in skip and s.nbytes():
                        storages[s.data_ptr()] = max(storages.get(s.data_ptr(), 0), s.nbytes())
        stack.extend(n for n, _ in node.next_functions)
    return sum(rounded(n) for n in storages.values())


def run_cpu(plan, torch, steps=2):
    """The plan's model on the CPU: parameters, the forward's saved set (without checkpoints), and `steps` training
    steps with the plan's optimizer (losses), as a smoke run and the saved-set measurement."""
    prog = plan["program_plan"]
    model = build(prog, torch)
    dev = torch.device("cpu")
    params = sum(p.numel() for p in model.parameters())
    B = plan["batch"]["micro_batch_size"]
    model.train()
    x, y = make_batch(prog, B, torch, dev)
    saved = None
    autocast = prog["autocast_dtype"]

    def ctx():  # the plan's autocast, on the CPU (memsim's figure holds autocast's weight copies too)
        return torch.autocast("cpu", dtype=getattr(torch, autocast or "bfloat16"), enabled=autocast is not None)

    if prog["checkpointing"]["mode"] == "none":
        with ctx():
            loss = loss_of(model, x, y, torch)
        # the collated batch (images and labels, one allocation in memsim) and the loss, as memsim counts them
        batch_bytes = x.numel() * x.element_size() + y.numel() * y.element_size()
        saved = saved_set_bytes(loss, model, torch) - rounded(x.numel() * x.element_size()) + rounded(batch_bytes) \
            + ROUND
        del loss
    units = checkpoint_units(model, prog, torch) if prog["checkpointing"]["mode"] == "full" else 0
    # the plan's torch optimizer; a fused kernel is CUDA's (torch 1.13 has none on the CPU): its foreach form
    kwargs = {k: v for k, v in plan["optimizer"]["kwargs"].items() if k != "fused"}
    opt = resolve(plan["optimizer"]["class"])(model.parameters(), **kwargs)
    losses = []
    for _ in range(steps):
        with ctx():
            loss = loss_of(model, x, y, torch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return {"params_total": params, "saved_bytes": saved, "checkpoint_units": units, "losses": losses}


def memsim_forward_bytes(config, cli):
    """memsim's forward_retained_bytes (what step 2's forward leaves allocated for backward, each tensor rounded to
    512 bytes) and its params_total, from memsim-cli."""
    out = subprocess.run([cli, "estimate", "--config", "-"], input=json.dumps(config), capture_output=True,
                         text=True, timeout=120)
    if out.returncode != 0:
        raise ProgramError("config", "memsim-cli: " + (out.stderr.strip() or out.stdout.strip())[:300])
    result = json.loads(out.stdout)
    return result["devices"][0]["forward_retained_bytes"], result["params_total"]
