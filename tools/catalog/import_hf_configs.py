#!/usr/bin/env python3
"""Generates src/core/catalog/models/hf_*.json from copies of Hugging Face config.json kept in public repositories.

    tools/catalog/import_hf_configs.py collect --mlc-git-dir PATH/mlc-llm/.git --gpu-poor-git-dir PATH/gpu_poor/.git
    tools/catalog/import_hf_configs.py generate [--out src/core/catalog/models]

tools/catalog/hf_configs.json holds one record per catalogue entry: HF id, display name, the config as its source
holds it (or the structural subset of it), and where it came from. `collect` rewrites the records of the two GitHub
sources below from their repositories at a fixed commit (repository, path, commit and key); the records whose source
is a "url" were transcribed from Hugging Face config.json pages (the model's own repository where a stored copy of
that page exists, otherwise a fine-tune or quantisation that copies it, named by its _name_or_path) and are kept as
they are. `generate` needs no network and no clone: it turns hf_configs.json into one hf_<org>.json per organisation
in memsim's model-entry format (src/core/catalog.h), read by the same importer as a pasted config.json.

GitHub sources (both copies of the models' config.json):
- mlc-ai/mlc-llm python/mlc_llm/model/model_preset.py: MODEL_PRESETS, a dict of full HF config.json copies, keyed
  by MLC's preset name (MLC adds runtime keys such as context_window_size, dropped here: they are no model shape).
- RahulSChand/gpu_poor public/all_configs.json: a reduced copy (architectures, hidden_size, intermediate_size,
  num_attention_heads, num_hidden_layers, vocab_size; GPT-2 style n_embd/n_head/n_layer/n_inner) of the config.json of
  about 3,000 HF repositories, keyed by HF id. It keeps no num_key_value_heads, so only models with multi-head
  attention are taken from it (LLaMA 1 and its fine-tunes, GPT-NeoX and Pythia, Qwen-1: each config of these has no
  num_key_value_heads); no model_type either, so it is set from
  `architectures` (ARCH_TYPE) and said in the entry's notes. Keys it drops (max_position_embeddings, rope settings)
  change no parameter count, but max_position_embeddings sizes the causal-mask buffer of transformers 4.38 and bounds
  the sequence, so only models whose context is the importer's default for the type are taken (LLaMA 1 and its
  fine-tunes, GPT-NeoX/Pythia: 2048; Qwen-1 14B: seq_length 2048). Llama 2 fine-tunes (4096), CodeLlama ones (16384)
  and YaRN extensions are left out, and so are GPT-2 models (DialoGPT, DistilGPT2): their copy drops attn_pdrop and
  resid_pdrop (0.1), whose dropout masks memsim counts.

Every entry keeps its source and params_expected: the parameter count of the HF module structure (modeling_<type>.py),
counted here independently of memsim (count_params); tests/core/test_catalog.cpp checks that memsim counts the same,
and checks the published totals of tools/catalog/published.json where an entry has one. Models whose architecture
memsim does not model are not taken (GPT-J, OPT, BLOOM, Baichuan, Falcon-RW: see NOT_TAKEN).
"""
import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "hf_configs.json"

MLC = {"repo": "mlc-ai/mlc-llm", "path": "python/mlc_llm/model/model_preset.py",
       "commit": "79d603f085f50500e9509fa01785ffa7ecfaaa93"}
GPU_POOR = {"repo": "RahulSChand/gpu_poor", "path": "public/all_configs.json",
            "commit": "ad2fc0ef0e6ceeb7684363504eecc3342a5e7dc4"}

PAGES = {"pages": "huggingface.co config.json pages, each record's own source url"}

# MLC runtime settings stored beside the HF keys in a preset.
MLC_ONLY = {"context_window_size", "prefill_chunk_size", "sliding_window_size", "attention_sink_size",
            "tensor_parallel_shards", "max_batch_size"}

# (MLC preset key, HF id, display name, note). The preset names no repository; the note says how it was matched.
FROM_MLC = [
    ("qwen2_0_5b", "Qwen/Qwen2-0.5B-Instruct", "Qwen2 0.5B Instruct", "eos_token_id 151645 (<|im_end|>): the Instruct config"),
    ("qwen2_1_5b", "Qwen/Qwen2-1.5B-Instruct", "Qwen2 1.5B Instruct", "eos_token_id 151645 (<|im_end|>): the Instruct config"),
    ("qwen2_7b", "Qwen/Qwen2-7B-Instruct", "Qwen2 7B Instruct", "eos_token_id 151645 (<|im_end|>): the Instruct config"),
    ("qwen", "Qwen/Qwen-1_8B-Chat", "Qwen 1.8B Chat", "Qwen-1 1.8B (hidden 2048, 24 layers); MLC's Qwen-1 preset"),
    ("internlm2_5_7b", "internlm/internlm2_5-7b-chat", "InternLM2.5 7B Chat", "rope_scaling dynamic x2: InternLM2.5"),
    ("olmo2_32b", "allenai/OLMo-2-0325-32B", "OLMo 2 32B", "OLMo 2 32B (64 layers of 5120, GQA 8): the 0325 release"),
    ("smollm_135m", "HuggingFaceTB/SmolLM-135M-Instruct", "SmolLM 135M Instruct", "_name_or_path cosmo2-135M-webinst-sc2, the SmolLM-Instruct fine-tune"),
    ("smollm_360m", "HuggingFaceTB/SmolLM-360M-Instruct", "SmolLM 360M Instruct", "_name_or_path cosmo2-350M-webinst-sc2, the SmolLM-Instruct fine-tune"),
    ("smollm_1_7b", "HuggingFaceTB/SmolLM-1.7B-Instruct", "SmolLM 1.7B Instruct", "_name_or_path cosmo2-1.7B-webinst-sc2, the SmolLM-Instruct fine-tune"),
    ("deepseek_v2_lite", "deepseek-ai/DeepSeek-V2-Lite-Chat", "DeepSeek-V2-Lite Chat", "DeepSeek-V2-Lite (27 layers, 64 routed experts, no q_lora_rank); the base and the Chat repository share this config"),
    ("stablelm-2-zephyr-1_6b", "stabilityai/stablelm-2-zephyr-1_6b", "StableLM 2 Zephyr 1.6B", ""),
    ("gemma2_2b-jpn", "google/gemma-2-2b-jpn-it", "Gemma 2 2B JPN IT", ""),
    ("tinyllama_1b_chat_v0.4", "TinyLlama/TinyLlama-1.1B-Chat-v0.4", "TinyLlama 1.1B Chat v0.4", "vocab 32003 (chat tokens added)"),
]

# HF ids taken from gpu_poor's reduced configs (multi-head attention only, see the docstring).
FROM_GPU_POOR = [
    ("huggyllama/llama-7b", "LLaMA 7B"), ("huggyllama/llama-13b", "LLaMA 13B"),
    ("huggyllama/llama-30b", "LLaMA 30B"), ("huggyllama/llama-65b", "LLaMA 65B"),
    ("lmsys/vicuna-7b-v1.1", "Vicuna 7B v1.1"),
    ("WizardLM/WizardLM-13B-V1.0", "WizardLM 13B V1.0"), ("WizardLM/WizardLM-13B-V1.1", "WizardLM 13B V1.1"),
    ("allenai/tulu-7b", "Tulu 7B"), ("allenai/tulu-13b", "Tulu 13B"),
    ("EleutherAI/gpt-neox-20b", "GPT-NeoX 20B"),
    ("EleutherAI/polyglot-ko-1.3b", "Polyglot-Ko 1.3B"), ("EleutherAI/polyglot-ko-3.8b", "Polyglot-Ko 3.8B"),
    ("EleutherAI/polyglot-ko-5.8b", "Polyglot-Ko 5.8B"), ("EleutherAI/polyglot-ko-12.8b", "Polyglot-Ko 12.8B"),
    ("OpenAssistant/oasst-sft-4-pythia-12b-epoch-3.5", "OpenAssistant SFT-4 Pythia 12B"),
    ("EleutherAI/pythia-70m-v0", "Pythia 70M v0"), ("EleutherAI/pythia-160m-v0", "Pythia 160M v0"),
    ("EleutherAI/pythia-410m-v0", "Pythia 410M v0"), ("EleutherAI/pythia-1b-v0", "Pythia 1B v0"),
    ("EleutherAI/pythia-1.4b-v0", "Pythia 1.4B v0"), ("EleutherAI/pythia-2.8b-v0", "Pythia 2.8B v0"),
    ("EleutherAI/pythia-6.9b-v0", "Pythia 6.9B v0"), ("EleutherAI/pythia-12b-v0", "Pythia 12B v0"),
    ("Qwen/Qwen-14B-Chat", "Qwen 14B Chat"),
]

ARCH_TYPE = {"LlamaForCausalLM": "llama", "GPTNeoXForCausalLM": "gpt_neox", "QWenLMHeadModel": "qwen"}

NOT_TAKEN = {
    "GPT-J (gptj)": "parallel attention and MLP with a biased MLP but unbiased attention: not a model_type memsim reads",
    "OPT (opt)": "learned positions with an offset of 2 and a projection pair in the 350M model: not modelled",
    "BLOOM (bloom)": "ALiBi, an embedding LayerNorm: not modelled",
    "Baichuan, InternLM 1, ChatGLM, MiniCPM, Orion, Cohere, StarCoder2, RWKV": "model types memsim does not read",
    "Qwen1.5 1.8B Chat (MLC preset 'qwen2')": "its copy has tie_word_embeddings true, the published 1.84B total is untied",
    "reduced configs of Llama 2 70B, CodeLlama 34B, Mistral and their fine-tunes": "grouped-query attention, which "
    "gpu_poor's copy drops (no num_key_value_heads)",
    "reduced configs of Llama 2 7B/13B and CodeLlama fine-tunes (StableBeluga, MythoMax, OpenChat v3, YaRN, Llemma, "
    "WizardCoder)": "their context (4096 to 131072) is not in gpu_poor's copy, and the importer's default of 2048 "
    "would size the causal-mask buffer and bound the sequence wrongly",
    "reduced configs of GPT-2 models (DialoGPT, DistilGPT2)": "the copy drops attn_pdrop and resid_pdrop (0.1 in their "
    "config.json), whose dropout masks memsim counts",
}


def git_show(git_dir, commit, path):
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], capture_output=True, text=True,
                          check=True).stdout


def collect(args):
    ns = {}
    exec(compile(git_show(args.mlc_git_dir, MLC["commit"], MLC["path"]), MLC["path"], "exec"), ns)
    presets = ns["MODEL_PRESETS"]
    gp = json.loads(git_show(args.gpu_poor_git_dir, GPU_POOR["commit"], GPU_POOR["path"]))
    # Records transcribed from HF config.json pages (source "url") are data kept as they are.
    old = json.loads(DATA.read_text())["records"] if DATA.exists() else []
    records = [r for r in old if "url" in r["source"]]
    for key, hf_id, name, note in FROM_MLC:
        cfg = {k: v for k, v in presets[key].items() if k not in MLC_ONLY}
        records.append({"hf_id": hf_id, "name": name, "config": cfg, "source": dict(MLC, key=key),
                        "notes": note, "reduced": False})
    for key, name in FROM_GPU_POOR:
        cfg = dict(gp[key])
        arch = (cfg.get("architectures") or [None])[0]
        if arch not in ARCH_TYPE:
            sys.exit(f"{key}: architecture {arch} not mapped")
        records.append({"hf_id": key, "name": name, "config": cfg,
                        "source": dict(GPU_POOR, key=key), "notes": "", "reduced": True})
    DATA.write_text(json.dumps({"sources": [MLC, GPU_POOR, PAGES], "not_taken": NOT_TAKEN, "records": records},
                               indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(records)} records to {DATA}")


# ---------------------------------------------------------------------------------------------------------------
# Parameter count of the HF module structure, per model_type (independent of memsim's C++ count).
# ---------------------------------------------------------------------------------------------------------------

def lin(i, o, bias):
    return i * o + (o if bias else 0)


def count_params(c):
    t = c["model_type"]
    h, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    nq = c["num_attention_heads"]
    nkv = c.get("num_key_value_heads") or nq
    hd = c.get("head_dim") or h // nq
    if t == "gpt_neox":  # GPTNeoXForCausalLM: fused query_key_value, dense, dense_h_to_4h/4h_to_h (all biased), 2 LN
        inter = c["intermediate_size"]
        per = 2 * 2 * h + lin(h, 3 * h, True) + lin(h, h, True) + lin(h, inter, True) + lin(inter, h, True)
        return V * h + L * per + 2 * h + V * h  # embed_in, final_layer_norm, embed_out (untied)
    if t == "qwen":  # QWenLMHeadModel: c_attn (bias), c_proj, w1/w2 of intermediate_size // 2, c_proj; RMSNorm
        half = c["intermediate_size"] // 2
        per = 2 * h + lin(h, 3 * h, True) + lin(h, h, False) + 2 * lin(h, half, False) + lin(half, h, False)
        return V * h + L * per + h + V * h
    tied = c.get("tie_word_embeddings", t in ("gemma", "gemma2"))
    norm = 2 * h if t == "stablelm" else h  # StableLM: nn.LayerNorm with bias
    attn_bias = bool(c.get("attention_bias"))
    qkv_bias = t == "qwen2" or bool(c.get("use_qkv_bias"))
    if t == "deepseek_v2":
        nope, rope, vd, r = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
        if c.get("q_lora_rank"):
            sys.exit("q_lora_rank not counted here")
        attn = h * nq * (nope + rope) + h * (r + rope) + r + r * nq * (nope + vd) + nq * vd * h
    else:
        attn = (lin(h, nq * hd, attn_bias or qkv_bias) + 2 * lin(h, nkv * hd, attn_bias or qkv_bias)
                + lin(nq * hd, h, attn_bias))
    if t == "olmo2":
        attn += nq * hd + nkv * hd  # q_norm, k_norm over the whole projection
    mlp_bias = bool(c.get("mlp_bias"))
    def gated(width):
        return 2 * lin(h, width, mlp_bias) + lin(width, h, mlp_bias)
    norms = 4 * h if t == "gemma2" else 2 * norm
    total = V * h + (0 if tied else V * h) + norm
    if t == "deepseek_v2":
        dense = c.get("first_k_dense_replace", 0)
        E, w = c["n_routed_experts"], c["moe_intermediate_size"]
        moe = h * E + E * gated(w) + gated(c.get("n_shared_experts", 0) * w)
        return total + L * (attn + norms) + dense * gated(c["intermediate_size"]) + (L - dense) * moe
    return total + L * (attn + gated(c["intermediate_size"]) + norms)


def entry_config(rec):
    cfg = dict(rec["config"])
    if rec["reduced"]:
        cfg["model_type"] = ARCH_TYPE[cfg["architectures"][0]]
    for k in [k for k, v in cfg.items() if v is None]:
        del cfg[k]
    return cfg


def generate(args):
    out = Path(args.out)
    data = json.loads(DATA.read_text())
    existing_ids, existing_hf = set(), {}
    for f in sorted(out.glob("*.json")):
        if f.name.startswith("hf_"):
            continue
        for m in json.loads(f.read_text())["models"]:
            existing_ids.add(m["id"])
            for h in [m.get("hf_id", "")] + m.get("hf_aliases", []):
                existing_hf[h.lower()] = m["id"]
    published = json.loads(Path(args.published).read_text())
    families, ids, skipped = {}, set(), []
    for rec in data["records"]:
        hf_id = rec["hf_id"]
        if hf_id.lower() in existing_hf:
            skipped.append(f"{hf_id}: already in the catalogue as {existing_hf[hf_id.lower()]}")
            continue
        cfg = entry_config(rec)
        org, repo = hf_id.split("/")
        eid = repo.lower()
        if eid in existing_ids or eid in ids:
            eid = hf_id.lower().replace("/", "--")
        if eid in existing_ids or eid in ids:
            sys.exit(f"duplicate id {eid}")
        ids.add(eid)
        s = rec["source"]
        notes = [n for n in [rec["notes"]] if n]
        if rec["reduced"]:
            notes.append(f"reduced copy (no model_type): model_type {cfg['model_type']} from architectures "
                         f"{cfg['architectures'][0]}; no num_key_value_heads, multi-head attention")
        if s.get("key", hf_id) != hf_id:
            notes.append(f"source key \"{s['key']}\"")
        e = {"id": eid, "name": rec["name"], "hf_id": hf_id}
        where = s["url"] if "url" in s else f"github:{s['repo']} {s['path']} @{s['commit'][:12]}, key \"{s['key']}\""
        e.update({"config": cfg, "config_source": where,
                  "params_expected": count_params(cfg),
                  "params_expected_why": "HF module count of the config (import_hf_configs.py count_params)"})
        if hf_id in published:
            p = published[hf_id]
            e["params_published"], e["params_source"] = p["params"], p["source"]
            if e["params_expected"] == p["params"]:
                del e["params_expected"], e["params_expected_why"]
            else:
                e["params_expected_why"] = p.get("why") or e["params_expected_why"]
        e["notes"] = "; ".join(notes)
        families.setdefault(org, []).append(e)
    n, written = 0, set()
    for org, entries in sorted(families.items()):
        fam = re.sub(r"[^a-z0-9]+", "_", org.lower()).strip("_")
        # The family is the organisation marked as this importer's: advice_candidates.cpp suggests "a smaller model"
        # from the same family, and the presets that were there before keep their suggestions.
        doc = {"family": f"{org} (config.json)", "source": "HF config.json copies in tools/catalog/hf_configs.json (" +
               ", ".join(f"github:{s['repo']} @{s['commit'][:12]}" if "repo" in s else s["pages"] for s in data["sources"]) +
               "); generated by tools/catalog/import_hf_configs.py, do not edit", "models": entries}
        path = out / f"hf_{fam}.json"
        text = json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
        if not path.exists() or path.read_text() != text:  # an unchanged file keeps its time: no CMake re-run
            path.write_text(text)
        written.add(path.name)
        n += len(entries)
    for f in out.glob("hf_*.json"):
        if f.name not in written:
            f.unlink()
    print(f"wrote {n} entries in {len(families)} files")
    for s in skipped:
        print("  skipped " + s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--mlc-git-dir", required=True)
    c.add_argument("--gpu-poor-git-dir", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--out", default=str(HERE.parents[1] / "src/core/catalog/models"))
    g.add_argument("--published", default=str(HERE / "published.json"))
    args = ap.parse_args()
    collect(args) if args.cmd == "collect" else generate(args)


if __name__ == "__main__":
    main()
