"""What the program generators (sd_unet.py, flux.py, sd3.py, whisper.py, mamba2.py, nemotron_h.py) share: pieces of
programs, and writing their JSON or checking it is current."""
import json
import os
import sys

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "core", "catalog", "architectures")


def mlp_embedding(module, x, width, tag, out):
    """diffusers TimestepEmbedding and PixArtAlphaTextProjection(act_fn="silu"), as UNet2DConditionModel's
    time_embedding and add_embedding and the DiTs' time_text_embed use them: linear_1, SiLU, linear_2."""
    return [
        {"op": "linear", "name": f"{module}.linear_1", "in": x, "out_features": width, "out": f"{tag}1"},
        {"op": "silu", "in": f"{tag}1", "out": f"{tag}2"},
        {"op": "linear", "name": f"{module}.linear_2", "in": f"{tag}2", "out_features": width, "out": out},
    ]


def token_embeddings(name):
    """A language model's embedding stage: the int64 input_ids' rows of `name`, tied to lm_head where
    tie_word_embeddings (Mamba2ForCausalLM, NemotronHForCausalLM, BambaForCausalLM)."""
    return {
        "ops": [
            {"op": "embedding", "name": name, "in": "input_ids", "rows": "vocab_size", "out_features": "hidden_size",
             "tied": "tie_word_embeddings", "out": "x0"},
        ],
        "output": "x0",
    }


def causal_lm_head(norm):
    """A causal LM's head on the fp32 or model-dtype stream (Mamba2ForCausalLM, NemotronHForCausalLM): the final
    norm, the cast to lm_head's dtype, lm_head, logits.float(), the shifted copy where the loss path copies it
    (transformers before 4.49) and the cross-entropy."""
    return {
        "input": "x",
        "ops": [
            {"op": "rms_norm", "name": norm, "in": "x", "out": "h"},
            {"op": "cast", "in": "h", "dtype": "weights", "out": "h_w"},
            {"op": "linear", "name": "lm_head", "in": "h_w", "out_features": "vocab_size", "bias": False,
             "out": "logits"},
            {"op": "cast", "in": "logits", "dtype": "fp32", "out": "logits32"},
            {"op": "copy", "in": "logits32", "shifted_logits": True, "out": "shifted"},
            {"op": "cross_entropy", "in": "shifted", "out": "loss"},
        ],
    }


def write_programs(programs, script):
    """Writes each (name, program) to src/core/catalog/architectures/NAME.json; with --check on the command line,
    writes nothing and exits 1 naming the files that differ from what `script` would write."""
    stale = []
    for name, program in programs:
        text = json.dumps(program, indent=1) + "\n"
        path = os.path.join(OUT_DIR, name + ".json")
        if "--check" in sys.argv:
            with open(path) as f:
                if f.read() != text:
                    stale.append(name)
            continue
        with open(path, "w") as f:
            f.write(text)
    if stale:
        print("%s differ from tools/programs/%s's output; run it" % (", ".join(stale), script), file=sys.stderr)
        sys.exit(1)
