#!/usr/bin/env python3
"""Generates src/core/catalog/models/litgpt_*.json from litgpt's litgpt/config.py (Lightning-AI/litgpt).

    tools/catalog/import_litgpt.py --git-dir PATH/TO/litgpt/.git [--out src/core/catalog/models] [--check]

It reads config.py at HEAD and at every earlier commit that changed it (configs litgpt has since removed, such as
Vicuna, RedPajama-INCITE or Dolly, are kept from the last commit that had them), executes each version with stub
modules for its imports (config.py is plain Python: dataclass dicts and loops that derive the -Instruct/-chat
variants), builds each Config to get litgpt's derived values (head_size, padded_vocab_size, n_query_groups,
intermediate_size), and writes one catalogue entry per Hugging Face repository in memsim's model-entry format
(src/core/catalog.h): a config section read by the same importer as a pasted HF config.json.

Mapping (litgpt -> memsim, see litgpt/model.py):
- vocab_size = padded_vocab_size: litgpt's embedding and head have padded_vocab_size rows, and
  scripts/convert_hf_checkpoint.py copies the HF tensors into them shape for shape, so padded_vocab_size is the row
  count of the HF checkpoint (= HF config.json vocab_size). litgpt's vocab_size is the tokenizer's size.
- n_query_groups -> num_key_value_heads, head_size -> head_dim, block_size -> max_position_embeddings.
- GptNeoxMLP: fc + proj, GELU (gelu_approximate "tanh" -> gelu_pytorch_tanh), mlp_gated false.
  LLaMAMLP: fc_1, fc_2, proj (gated SwiGLU, silu). GemmaMLP: the same with tanh GELU. LLaMAMoE: a gate without bias and
  n_expert LLaMAMLP experts of moe_intermediate_size (or intermediate_size), n_expert_per_token routed.
- bias: every linear of attention and MLP has a bias (attention_bias and mlp_bias); attn_bias alone: only the
  fused qkv linear (qkv_bias). lm_head_bias as is.
- norms per layer: norm_1 + norm_2 (none when shared_attention_norm: one norm feeds attention and MLP in parallel)
  + post_attention_norm + post_mlp_norm. norm_qk: q and k norms per head, or over the whole projection
  (norm_qk_type olmo2).
- tie_word_embeddings is not in litgpt's config (its model always has a separate lm_head, filled from the
  embedding by the converter when the HF checkpoint has none). TIED below lists the HF repositories whose
  config.json ties them, with the reason; memsim then does not count the head.

Every entry keeps its source (commit and Config name) and params_expected: the parameter count of litgpt's module
structure, counted here independently of memsim (the head left out where tied); tests/core/test_catalog.cpp checks
that memsim counts the same, and checks a sample against published totals (PUBLISHED below).
"""
import argparse
import json
import re
import subprocess
import sys
import types
from pathlib import Path

CONFIG_PATHS = ("litgpt/config.py", "lit_gpt/config.py")

# HF repos whose config.json has tie_word_embeddings true (litgpt does not say). Regexes on the HF id.
TIED = [
    (r"^google/(code)?gemma", "Gemma ties the head to the embedding (GemmaConfig default tie_word_embeddings=True)"),
    (r"^meta-llama/Llama-3\.2-[13]B", "Llama 3.2 1B and 3B config.json: tie_word_embeddings true"),
    (r"^Qwen/Qwen2\.5-(Coder-|Math-)?(0\.5|1\.5|3)B", "Qwen2.5 0.5B/1.5B/3B (and their Coder/Math) config.json: tie_word_embeddings true"),
    (r"^Qwen/Qwen3-(0\.6|1\.7|4)B", "Qwen3 0.6B/1.7B/4B config.json: tie_word_embeddings true"),
    (r"^HuggingFaceTB/SmolLM2-", "SmolLM2 config.json: tie_word_embeddings true"),
    (r"^tiiuae/falcon-(7b|40b|180B)", "FalconForCausalLM ties lm_head to word_embeddings (PretrainedConfig default)"),
    (r"^microsoft/Phi-4-mini", "Phi-4-mini config.json: tie_word_embeddings true"),
    (r"^allenai/OLMo-1B", "OLMo-1B was trained with weight tying (config.json tie_word_embeddings true)"),
]

# Configs memsim cannot represent, with the reason (matched on the litgpt name). Empty: every current config maps.
SKIP_NAMES = {}

# OLMo 1 LayerNorms have no weight or bias (litgpt: LayerNorm(elementwise_affine=False) when "OLMo" is in the name;
# HF OlmoLayerNorm has no parameters); memsim's LayerNorm has both.
NONAFFINE_LAYERNORM = re.compile(r"^OLMo-(1B|7B)")


def stub_modules():
    def find_multiple(n, k):
        return n if n % k == 0 else n + k - (n % k)

    class Anything:
        def __getattr__(self, k):
            return Anything()

        def __call__(self, *a, **k):
            return Anything()

        def __getitem__(self, k):
            return Anything()

        def __or__(self, o):
            return Anything()

        __ror__ = __or__

    class Stub(types.ModuleType):
        def __getattr__(self, k):
            if k == "find_multiple":
                return find_multiple
            if k.startswith("__"):
                raise AttributeError(k)
            return Anything()

    te = types.ModuleType("typing_extensions")
    te.Self = object
    sys.modules["typing_extensions"] = te
    for m in ["yaml", "torch", "torch.nn", "lit_gpt", "lit_gpt.utils", "lit_gpt.model", "lit_gpt.rmsnorm", "litgpt",
              "litgpt.utils", "litgpt.model"]:
        sys.modules[m] = Stub(m)


def git(git_dir, *args):
    return subprocess.run(["git", "--git-dir", git_dir, *args], capture_output=True, text=True, check=True).stdout


def load_version(git_dir, commit):
    """The Config class and the config dicts of config.py at one commit, or None."""
    for path in CONFIG_PATHS:
        try:
            src = git(git_dir, "show", f"{commit}:{path}")
        except subprocess.CalledProcessError:
            continue
        ns = {"__name__": "litgpt_config"}
        try:
            exec(compile(src, path, "exec"), ns)
        except Exception:
            return None
        configs = ns.get("configs")
        if not isinstance(configs, list):
            configs = list(ns.get("name_to_config", {}).values())
        configs = [c for c in configs if isinstance(c, dict)]
        return (ns["Config"], configs, path) if configs else None
    return None


def attr(o, *names, default=None):
    for n in names:
        if hasattr(o, n):
            return getattr(o, n)
    return default


def count_litgpt(o, tied, head_size):
    """Parameters of litgpt's GPT (litgpt/model.py) for config o; the head left out where HF ties it."""
    e, L = o.n_embd, o.n_layer
    nq, nkv = o.n_head, o.n_query_groups
    bias = bool(o.bias)
    mlp = attr(o, "mlp_class_name", "_mlp_class")
    norm = attr(o, "norm_class_name", "_norm_class")
    nonaffine = norm == "LayerNorm" and "OLMo" in o.name
    def norm_p(n):
        if nonaffine:
            return 0
        return 2 * n if norm == "LayerNorm" else n
    def lin(i, out, b):
        return i * out + (out if b else 0)
    V = o.padded_vocab_size
    total = V * e + norm_p(e)  # wte, ln_f
    if not tied:
        total += lin(e, V, bool(attr(o, "lm_head_bias", default=False)))
    per = 0
    per += lin(e, (nq + 2 * nkv) * head_size, bias or bool(attr(o, "attn_bias", default=False)))
    per += lin(head_size * nq, e, bias)
    if attr(o, "norm_qk", default=False):
        olmo2 = attr(o, "norm_qk_type", default="default") == "olmo2"
        per += norm_p(nq * head_size if olmo2 else head_size) + norm_p(nkv * head_size if olmo2 else head_size)
    nnorm = norms_per_layer(o)
    per += nnorm * norm_p(e)
    def llama_mlp(width):
        return 2 * lin(e, width, bias) + lin(width, e, bias)
    if mlp == "GptNeoxMLP":
        per += lin(e, o.intermediate_size, bias) + lin(o.intermediate_size, e, bias)
    elif mlp in ("LLaMAMLP", "GemmaMLP"):
        per += llama_mlp(o.intermediate_size)
    elif mlp == "LLaMAMoE":
        width = attr(o, "moe_intermediate_size") or o.intermediate_size
        per += e * o.n_expert + o.n_expert * llama_mlp(width)
    else:
        raise ValueError(mlp)
    return total + L * per


def norms_per_layer(o):
    n = 0
    if attr(o, "norm_1", default=True):
        n += 1
    if attr(o, "norm_2", default=True) and not attr(o, "shared_attention_norm", default=False):
        n += 1
    n += int(bool(attr(o, "post_attention_norm", default=False))) + int(bool(attr(o, "post_mlp_norm", default=False)))
    return n


def model_type(o, hf_id):
    mlp = attr(o, "mlp_class_name", "_mlp_class")
    norm = attr(o, "norm_class_name", "_norm_class")
    org = hf_id.split("/")[0]
    if mlp == "GptNeoxMLP":
        if org == "tiiuae":
            return "falcon"
        if org == "microsoft":
            return "phi"
        return "gpt_neox"
    if mlp == "GemmaMLP":
        if attr(o, "norm_qk", default=False):
            return "gemma3_text"
        return "gemma2" if attr(o, "post_attention_norm", default=False) else "gemma"
    if mlp == "LLaMAMoE":
        return "qwen3_moe" if attr(o, "norm_qk", default=False) else "mixtral"
    if norm == "LayerNorm":
        return "olmo" if org == "allenai" else "stablelm"
    if attr(o, "norm_qk", default=False):
        return "olmo2" if attr(o, "norm_qk_type", default="default") == "olmo2" else "qwen3"
    if attr(o, "attn_bias", default=False) and not o.bias:
        return "qwen2"
    if org == "microsoft":
        return "phi3"
    if org == "mistralai" or org == "unsloth" and "Mistral" in hf_id:
        return "mistral"
    return "llama"


def tie_reason(hf_id):
    for pat, why in TIED:
        if re.search(pat, hf_id):
            return why
    return None


def entry_for(o, commit, path, date):
    hf = o.hf_config
    hf_id = f"{hf['org']}/{hf['name']}"
    mlp = attr(o, "mlp_class_name", "_mlp_class")
    norm = attr(o, "norm_class_name", "_norm_class")
    head_size = attr(o, "head_size") or o.n_embd // o.n_head
    tied_why = tie_reason(hf_id)
    tied = tied_why is not None
    gelu = "gelu_pytorch_tanh" if attr(o, "gelu_approximate", default="none") == "tanh" else "gelu"
    act = {"GptNeoxMLP": gelu, "LLaMAMLP": "silu", "GemmaMLP": "gelu_pytorch_tanh", "LLaMAMoE": "silu"}[mlp]
    bias = bool(o.bias)
    attn_bias = bool(attr(o, "attn_bias", default=False))
    cfg = {
        "model_type": model_type(o, hf_id),
        "hidden_size": o.n_embd,
        "num_hidden_layers": o.n_layer,
        "num_attention_heads": o.n_head,
        "num_key_value_heads": o.n_query_groups,
        "head_dim": head_size,
        "intermediate_size": o.intermediate_size,
        "vocab_size": o.padded_vocab_size,
        "max_position_embeddings": o.block_size,
        "tie_word_embeddings": tied,
        "hidden_act": act,
        "norm_type": "layernorm" if norm == "LayerNorm" else "rmsnorm",
        "norms_per_layer": norms_per_layer(o),
        "mlp_gated": mlp != "GptNeoxMLP",
        "attention_bias": bias,
        "mlp_bias": bias,
        "qkv_bias": attn_bias and not bias,
        "lm_head_bias": bool(attr(o, "lm_head_bias", default=False)),
        "qk_norm": bool(attr(o, "norm_qk", default=False)),
    }
    if cfg["qk_norm"]:
        cfg["qk_norm_per_head"] = attr(o, "norm_qk_type", default="default") != "olmo2"
    if mlp == "LLaMAMoE":
        cfg["num_experts"] = o.n_expert
        cfg["num_experts_per_tok"] = o.n_expert_per_token
        if attr(o, "moe_intermediate_size"):
            cfg["moe_intermediate_size"] = o.moe_intermediate_size
    params = count_litgpt(o, tied, head_size)
    e = {
        "id": hf["name"].lower(),
        "name": hf["name"],
        "hf_id": hf_id,
        "config": cfg,
        "config_source": f"litgpt {path} @{commit[:12]} ({date[:10]}), Config \"{o.name}\"",
        "params_expected": params,
        "params_expected_why": "litgpt's module count (import_litgpt.py)" + (", head tied" if tied else ""),
    }
    notes = [f"litgpt vocab_size {o.vocab_size} (tokenizer), padded_vocab_size {o.padded_vocab_size} (embedding rows, used)"]
    if tied:
        notes.append("tied head: " + tied_why)
    if attr(o, "parallel_residual", default=False) and norms_per_layer(o) == 2:
        notes.append("parallel residual with two norms: memsim lays the block out sequentially (same parameters)")
    if NONAFFINE_LAYERNORM.match(o.name) and norm == "LayerNorm":
        extra = (2 * o.n_layer + 1) * 2 * o.n_embd
        e["params_expected"] = params + extra
        e["params_expected_why"] = (f"litgpt's count {params} + {extra}: OLMo's LayerNorms have no weight or bias "
                                    "(elementwise_affine=False), memsim's LayerNorm has both, (2 x layers + 1) x 2 x hidden")
    e["notes"] = "; ".join(notes)
    return e


def collect(git_dir):
    """Each litgpt config by name, from the newest commit that has it: (Config object, commit, path, date)."""
    log = [l.split() for l in git(git_dir, "log", "--format=%H %cI", "--", *CONFIG_PATHS).splitlines() if l]
    seen = {}
    for commit, date in log:
        v = load_version(git_dir, commit)
        if v is None:
            continue
        Config, configs, path = v
        for c in configs:
            if c["name"] in seen:
                continue
            try:
                o = Config(**c)
            except Exception as ex:
                seen[c["name"]] = ("error", f"Config() fails at {commit[:8]}: {ex}")
                continue
            seen[c["name"]] = (o, commit, path, date)
    return seen, git(git_dir, "rev-parse", "HEAD").strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--git-dir", required=True)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[2] / "src/core/catalog/models"))
    ap.add_argument("--published", default=str(Path(__file__).with_name("published.json")))
    args = ap.parse_args()
    stub_modules()
    out = Path(args.out)
    existing_ids, existing_hf = set(), {}
    for f in sorted(out.glob("*.json")):
        if f.name.startswith("litgpt_"):
            continue
        for m in json.loads(f.read_text())["models"]:
            existing_ids.add(m["id"])
            existing_hf[m.get("hf_id", "").lower()] = m["id"]
            for a in m.get("hf_aliases", []):
                existing_hf[a.lower()] = m["id"]
    published = json.loads(Path(args.published).read_text()) if Path(args.published).exists() else {}
    seen, head = collect(args.git_dir)
    families, skipped, duplicates, ids = {}, [], [], set()
    for name, v in sorted(seen.items()):
        if v[0] == "error":
            skipped.append((name, v[1]))
            continue
        o, commit, path, date = v
        hf = getattr(o, "hf_config", {}) or {}
        if not hf.get("org") or not hf.get("name"):
            skipped.append((name, "no Hugging Face repository (hf_config empty)"))
            continue
        if name in SKIP_NAMES:
            skipped.append((name, SKIP_NAMES[name]))
            continue
        if attr(o, "latent_attention"):
            skipped.append((name, "multi-head latent attention: not mapped by this importer"))
            continue
        hf_id = f"{hf['org']}/{hf['name']}"
        if hf_id.lower() in existing_hf:
            duplicates.append((hf_id, existing_hf[hf_id.lower()]))
            continue
        e = entry_for(o, commit, path, date)
        if e["id"] in existing_ids or e["id"] in ids:
            e["id"] = hf_id.lower().replace("/", "--")
        if e["id"] in existing_ids or e["id"] in ids:
            sys.exit(f"duplicate id {e['id']}")
        if hf_id.lower() in {h.lower() for h in [x["hf_id"] for f in families.values() for x in f]}:
            duplicates.append((hf_id, "another litgpt config (" + name + ")"))
            continue
        ids.add(e["id"])
        if hf_id in published:
            p = published[hf_id]
            e["params_published"] = p["params"]
            e["params_source"] = p["source"]
            if e["params_expected"] == p["params"]:
                del e["params_expected"], e["params_expected_why"]
            else:
                e["params_expected_why"] = p.get("why") or e["params_expected_why"]
        families.setdefault(hf["org"], []).append(e)
    n, written = 0, set()
    for org, entries in sorted(families.items()):
        fam = re.sub(r"[^a-z0-9]+", "_", org.lower()).strip("_")
        doc = {"family": org, "source": f"github:Lightning-AI/litgpt litgpt/config.py (HEAD {head}); "
                                       "generated by tools/catalog/import_litgpt.py, do not edit", "models": entries}
        path = out / f"litgpt_{fam}.json"
        text = json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
        if not path.exists() or path.read_text() != text:  # an unchanged file keeps its time: no CMake re-run
            path.write_text(text)
        written.add(path.name)
        n += len(entries)
    for f in out.glob("litgpt_*.json"):
        if f.name not in written:
            f.unlink()
    print(f"litgpt HEAD {head}: {len(seen)} configs; wrote {n} entries in {len(families)} files")
    print(f"duplicates of hand-collected entries (kept those): {len(duplicates)}")
    for hf_id, ex in duplicates:
        print(f"  {hf_id} -> {ex}")
    print(f"skipped: {len(skipped)}")
    for name, why in skipped:
        print(f"  {name}: {why}")


if __name__ == "__main__":
    main()
