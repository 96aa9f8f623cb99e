"""Writes src/core/catalog/architectures/whisper.json: transformers' WhisperForConditionalGeneration as a model
program (docs/research/whisper.md has the reading of modeling_whisper.py it follows).

The stages, in the order the model runs them:
- embeddings: the encoder's conv front end (conv1, GELU, conv2 with stride 2, GELU), the permute to token rows and
  the frozen sinusoidal positions, then the decoder's token embedding (tied to proj_out) plus its learned positions,
  which the decoder's first stage reads as a carry. transformers embeds the decoder's ids only after the encoder has
  run; here they are embedded first, which keeps [target_length, d_model] per sample alive over the encoder (under
  1% of an encoder layer's saved set at any size);
- model.encoder.layers: pre-LN self-attention and GELU MLP, repeated;
- model.encoder.layer_norm: the encoder's final norm, whose output every decoder layer's cross-attention reads (a
  carry), and the decoder's embedding dropout, which starts the decoder's stream;
- model.decoder.layers: causal self-attention, cross-attention over the encoder's output, MLP;
- head: the decoder's final norm, proj_out (the embedding's weight) and the cross-entropy over every label row.

WhisperAttention projects q, k and v, scales q (q_proj(x) * scaling) and makes each contiguous in [batch, heads,
rows, head_dim] (_shape: view, transpose(1, 2), contiguous()): the copies are what the kernel reads and keeps.
"""
from common import write_programs


def attention(prefix, x, kv, heads, tag):
    """One WhisperAttention: q from x, k and v from kv (x itself, or the encoder's output for encoder_attn)."""
    return [
        {"op": "linear", "name": f"{prefix}.q_proj", "in": x, "out_features": "d_model", "out": f"{tag}_q"},
        {"op": "scale", "in": f"{tag}_q", "out": f"{tag}_qs"},
        {"op": "copy", "in": f"{tag}_qs", "out": f"{tag}_qc"},
        {"op": "linear", "name": f"{prefix}.k_proj", "in": kv, "out_features": "d_model", "bias": False, "out": f"{tag}_k"},
        {"op": "copy", "in": f"{tag}_k", "out": f"{tag}_kc"},
        {"op": "linear", "name": f"{prefix}.v_proj", "in": kv, "out_features": "d_model", "out": f"{tag}_v"},
        {"op": "copy", "in": f"{tag}_v", "out": f"{tag}_vc"},
        {"op": "attention", "in": [f"{tag}_qc", f"{tag}_kc", f"{tag}_vc"], "heads": heads,
         "dropout": "attention_dropout", "out": f"{tag}_ctx"},
        {"op": "linear", "name": f"{prefix}.out_proj", "in": f"{tag}_ctx", "out_features": "d_model", "out": f"{tag}_o"},
        {"op": "dropout", "in": f"{tag}_o", "p": "dropout", "out": f"{tag}_od"},
    ]


def residual_attention(layer, norm, attn, x, kv, heads, tag):
    """residual = x; x = norm(x); x = attn(x); dropout; x = residual + x (WhisperEncoderLayer, WhisperDecoderLayer)."""
    return ([{"op": "layer_norm", "name": f"{layer}.{norm}", "in": x, "out": f"{tag}_ln"}] +
            attention(f"{layer}.{attn}", f"{tag}_ln", kv if kv else f"{tag}_ln", heads, tag) +
            [{"op": "add", "in": [x, f"{tag}_od"], "out": f"{tag}_out"}])


def mlp(layer, x, ffn, tag):
    """residual = x; final_layer_norm, fc1, GELU, activation dropout, fc2, dropout; residual + x."""
    return [
        {"op": "layer_norm", "name": f"{layer}.final_layer_norm", "in": x, "out": f"{tag}_ln"},
        {"op": "linear", "name": f"{layer}.fc1", "in": f"{tag}_ln", "out_features": ffn, "out": f"{tag}_f1"},
        {"op": "gelu", "in": f"{tag}_f1", "out": f"{tag}_act"},
        {"op": "dropout", "in": f"{tag}_act", "p": "activation_dropout", "out": f"{tag}_actd"},
        {"op": "linear", "name": f"{layer}.fc2", "in": f"{tag}_actd", "out_features": "d_model", "out": f"{tag}_f2"},
        {"op": "dropout", "in": f"{tag}_f2", "p": "dropout", "out": f"{tag}_f2d"},
        {"op": "add", "in": [x, f"{tag}_f2d"], "out": f"{tag}_out"},
    ]


def whisper():
    enc, dec = "model.encoder.layers", "model.decoder.layers"
    embeddings = {
        "ops": [
            {"op": "conv1d", "name": "model.encoder.conv1", "in": "input_features", "out_channels": "d_model",
             "kernel": 3, "stride": 1, "padding": 1, "out": "c1"},
            {"op": "gelu", "in": "c1", "out": "g1"},
            {"op": "conv1d", "name": "model.encoder.conv2", "in": "g1", "out_channels": "d_model",
             "kernel": 3, "stride": 2, "padding": 1, "out": "c2"},
            {"op": "gelu", "in": "c2", "out": "g2"},
            {"op": "flatten_tokens", "in": "g2", "out": "rows"},
            {"op": "parameter", "name": "model.encoder.embed_positions.weight",
             "shape": ["max_source_positions", "d_model"], "frozen": "frozen_encoder_positions", "out": "enc_pos"},
            {"op": "add", "in": ["rows", "enc_pos"], "out": "enc_in"},
            {"op": "dropout", "in": "enc_in", "p": "dropout", "out": "enc_h"},
            {"op": "embedding", "name": "model.decoder.embed_tokens", "in": "decoder_input_ids",
             "rows": "vocab_size", "out_features": "d_model", "tied": True, "out": "tok"},
            {"op": "parameter", "name": "model.decoder.embed_positions.weight",
             "shape": ["max_target_positions", "d_model"], "out": "dec_pos_table"},
            {"op": "slice", "in": "dec_pos_table", "axis": "tokens", "start": 0, "size": "target_length",
             "out": "dec_pos"},
            {"op": "add", "in": ["tok", "dec_pos"], "out": "decoder_embeds"},
        ],
        "output": "enc_h",
        "carry": ["decoder_embeds"],
    }
    encoder_layer = {
        "name": enc, "repeat": "encoder_layers", "input": "x",
        "ops": residual_attention(enc, "self_attn_layer_norm", "self_attn", "x", None, "encoder_attention_heads", "sa") +
        mlp(enc, "sa_out", "encoder_ffn_dim", "mlp"),
        "output": "mlp_out",
    }
    encoder_end = {
        "name": "model.encoder.layer_norm", "repeat": 1, "checkpoint": False, "input": "x",
        "ops": [
            {"op": "layer_norm", "name": "model.encoder.layer_norm", "in": "x", "out": "encoder_hidden_states"},
            {"op": "dropout", "in": "decoder_embeds", "p": "dropout", "out": "dec_h"},
        ],
        "output": "dec_h",
        "carry": ["encoder_hidden_states"],
    }
    decoder_layer = {
        "name": dec, "repeat": "decoder_layers", "input": "x",
        "ops": residual_attention(dec, "self_attn_layer_norm", "self_attn", "x", None, "decoder_attention_heads", "sa") +
        residual_attention(dec, "encoder_attn_layer_norm", "encoder_attn", "sa_out", "encoder_hidden_states",
                           "decoder_attention_heads", "ca") +
        mlp(dec, "ca_out", "decoder_ffn_dim", "mlp"),
        "output": "mlp_out",
    }
    head = {
        "input": "x",
        "ops": [
            {"op": "layer_norm", "name": "model.decoder.layer_norm", "in": "x", "out": "h"},
            {"op": "linear", "name": "proj_out", "in": "h", "out_features": "vocab_size", "bias": False, "out": "logits"},
            {"op": "cross_entropy", "in": "logits", "out": "loss"},
        ],
    }
    return {
        "memsim_architecture": 1,
        "name": "whisper",
        "title": "Whisper speech recognition (encoder-decoder)",
        "source": "transformers v4.46.0 src/transformers/models/whisper/modeling_whisper.py "
                  "(WhisperForConditionalGeneration, WhisperEncoder, WhisperDecoder, WhisperAttention), "
                  "configuration_whisper.py (WhisperConfig defaults: whisper-tiny's). docs/research/whisper.md. "
                  "Generated by tools/programs/whisper.py",
        # PEFT's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING["whisper"]
        "lora_targets": "q_proj,v_proj",
        # get_keys_to_not_convert keeps the tied output embedding in 16 bits under load_in_8bit / load_in_4bit
        "not_quantized": ["proj_out"],
        "model_types": ["whisper"],
        # a config.json that unties proj_out would need an untied program: its import is refused, not misread
        "requires": {"tie_word_embeddings": {"equals": True, "when_absent": True}},
        "hyperparameters": {
            "vocab_size": 51865, "num_mel_bins": 80, "d_model": 384,
            "encoder_layers": 4, "encoder_attention_heads": 6, "encoder_ffn_dim": 1536,
            "decoder_layers": 4, "decoder_attention_heads": 6, "decoder_ffn_dim": 1536,
            "max_source_positions": 1500, "max_target_positions": 448,
            "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0,
            # memsim's: the labels' padded length in a batch (DataCollatorSpeechSeq2SeqWithPadding pads them to the
            # longest), at most max_target_positions
            "target_length": 448,
            # WhisperEncoder.__init__: embed_positions.requires_grad_(False) (docs/research/whisper.md section 1)
            "frozen_encoder_positions": 1,
        },
        "dims": {"frames": "2 * max_source_positions"},
        "inputs": {
            # WhisperFeatureExtractor pads every clip to 30 s: log-mel frames, fp32 from the collator
            "input_features": {"shape": ["num_mel_bins", "frames"]},
            # shift_tokens_right(labels): the labels' length
            "decoder_input_ids": {"shape": ["target_length"], "dtype": "int64"},
        },
        "embeddings": embeddings,
        "blocks": [encoder_layer, encoder_end, decoder_layer],
        "head": head,
    }


if __name__ == "__main__":
    write_programs([("whisper", whisper())], "whisper.py")
