#!/usr/bin/env python3
"""What a torchtune-style Llama layer saves for backward, eager against torch.compile (Inductor's min-cut
partitioner), recorded with saved_tensors_hooks (AOTAutograd's compiled function saves through ctx as well).

    python3 compile_saved.py OUT.json

Prints and writes, per mode, every saved tensor's shape, dtype and bytes for one layer, and the layer's forward
memory growth (memory_allocated after forward minus before) for 1 and 2 layers. Needs a CUDA GPU and torch >= 2.1.
"""
import json
import sys

import torch
import torch.nn.functional as F
from torch import nn

B, S, H, HQ_HEADS, KV_HEADS, HD, FF = 2, 2048, 3072, 24, 8, 128, 8192


class RMSNorm(nn.Module):  # torchtune/modules/rms_norm.py
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x_fp32 = x.float()
        x_normed = (x_fp32 * torch.rsqrt(x_fp32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)
        return x_normed * self.scale


def rope(x, cos, sin):  # torchtune RotaryPositionalEmbeddings: pairs, computed in fp32, cast back
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    out = torch.stack([xs[..., 0] * c - xs[..., 1] * s, xs[..., 1] * c + xs[..., 0] * s], -1)
    return out.flatten(3).type_as(x)


class Layer(nn.Module):  # torchtune TransformerSelfAttentionLayer + MultiHeadAttention + FeedForward
    def __init__(self):
        super().__init__()
        self.sa_norm, self.mlp_norm = RMSNorm(H), RMSNorm(H)
        self.q = nn.Linear(H, HQ_HEADS * HD, bias=False)
        self.k = nn.Linear(H, KV_HEADS * HD, bias=False)
        self.v = nn.Linear(H, KV_HEADS * HD, bias=False)
        self.o = nn.Linear(HQ_HEADS * HD, H, bias=False)
        self.w1 = nn.Linear(H, FF, bias=False)
        self.w3 = nn.Linear(H, FF, bias=False)
        self.w2 = nn.Linear(FF, H, bias=False)

    def forward(self, x, cos, sin):
        h = self.sa_norm(x)
        b, s, _ = h.shape
        q = rope(self.q(h).view(b, s, HQ_HEADS, HD), cos, sin)
        k = rope(self.k(h).view(b, s, KV_HEADS, HD), cos, sin)
        v = self.v(h).view(b, s, KV_HEADS, HD)
        rep = HQ_HEADS // KV_HEADS  # torchtune expands k/v before SDPA
        k = k.unsqueeze(3).expand(b, s, KV_HEADS, rep, HD).reshape(b, s, HQ_HEADS, HD)
        v = v.unsqueeze(3).expand(b, s, KV_HEADS, rep, HD).reshape(b, s, HQ_HEADS, HD)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.o(o.transpose(1, 2).reshape(b, s, -1))
        m = self.mlp_norm(x)
        return x + self.w2(F.silu(self.w1(m)) * self.w3(m))


def record(layers, compiled):
    saved = []

    def pack(t):
        saved.append({"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                      "bytes": t.untyped_storage().nbytes(), "ptr": t.untyped_storage().data_ptr()})
        return t

    x = torch.randn(B, S, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    pos = torch.arange(S, device="cuda", dtype=torch.float32)
    inv = 1.0 / (500000 ** (torch.arange(0, HD, 2, device="cuda", dtype=torch.float32) / HD))
    ang = torch.outer(pos, inv)
    cos, sin = ang.cos(), ang.sin()
    fns = [torch.compile(l) if compiled else l for l in layers]
    # warm-up (compile) outside the measurement
    y = x
    for f in fns:
        y = f(y, cos, sin)
    y.sum().backward()
    del y
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    y = x
    for f in fns:
        y = f(y, cos, sin)
    torch.cuda.synchronize()
    grown = torch.cuda.memory_allocated() - before
    y.sum().backward()
    del y
    try:  # the saved tensors themselves (hooks may make dynamo recompile; the growth above is the measurement)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = x
            for f in fns:
                y = f(y, cos, sin)
        y.sum().backward()
    except Exception as e:  # noqa: BLE001
        saved.append({"shape": [], "dtype": f"hooks failed: {type(e).__name__}: {str(e)[:200]}", "bytes": 0, "ptr": -1})
    return saved, grown


def main():
    out = {"torch": torch.__version__, "shape": {"B": B, "S": S, "H": H, "heads": HQ_HEADS, "kv_heads": KV_HEADS,
                                                  "head_dim": HD, "ffn": FF}, "modes": {}}
    torch.manual_seed(0)
    for compiled in (False, True):
        mode = "compiled" if compiled else "eager"
        res = {}
        for n in (1, 2):
            torch._dynamo.reset()
            layers = [Layer().cuda().to(torch.bfloat16) for _ in range(n)]
            saved, grown = record(layers, compiled)
            uniq = {}
            for s in saved:
                uniq.setdefault(s["ptr"], s)
            res[f"{n}_layers"] = {"forward_growth_bytes": grown, "saved_unique_bytes": sum(s["bytes"] for s in uniq.values()),
                                  "saved": [{k: v for k, v in s.items() if k != "ptr"} for s in uniq.values()]}
            print(mode, n, "layers: forward growth", grown, "saved unique", res[f"{n}_layers"]["saved_unique_bytes"], flush=True)
        res["per_layer_growth_bytes"] = res["2_layers"]["forward_growth_bytes"] - res["1_layers"]["forward_growth_bytes"]
        print(mode, "per layer", res["per_layer_growth_bytes"], "=", res["per_layer_growth_bytes"] / (B * S), "bytes/token",
              flush=True)
        for s in res["1_layers"]["saved"]:
            print("   ", s["dtype"], s["shape"], s["bytes"])
        out["modes"][mode] = res
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
