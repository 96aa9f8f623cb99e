#!/usr/bin/env python3
"""Turns an allocator trace written by calibrate.py (MEMSIM_CALIB_TRACE_DIR) into the replay format that
tests/core/test_allocator.cpp reads, so that memsim's caching-allocator model is checked against PyTorch's own
event sequence.

    alloc_trace.py ID.trace.json[.gz] OUT.trace [--source TEXT]

Replay format, one event per line after '#' header lines:
    s ADDRESS SIZE   the allocator reserved a segment at ADDRESS (relative to the lowest segment address)
    a ID SIZE        a block of SIZE requested bytes was allocated; ID names it until
    f ID             it is freed
The header gives the peaks the trace itself implies: reserved (the sum of segment sizes, nothing is ever
released in these runs) and allocated (the sum of live blocks' sizes as the trace reports them).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys


def convert(trace, source):
    events = trace["events"]
    seg_addrs = [e[1] for e in events if e[0] == "segment_alloc"]
    if any(e[0] == "segment_free" for e in events):
        raise ValueError("the trace releases segments (empty_cache or an OOM retry): not a plain replay")
    if any(e[0] in ("segment_map", "segment_unmap") for e in events):
        raise ValueError("the trace maps pages into expandable segments (PYTORCH_CUDA_ALLOC_CONF="
                         "expandable_segments:True): the replay format holds cudaMalloc segments only")
    base = min(seg_addrs) if seg_addrs else 0
    ids, next_id, live = {}, 0, {}
    reserved = allocated = peak_allocated = 0
    lines = []
    for action, addr, size, _stream in events:
        if action == "segment_alloc":
            reserved += size
            lines.append(f"s {addr - base} {size}")
        elif action == "alloc":
            ids[addr] = next_id
            live[addr] = size
            allocated += size
            peak_allocated = max(peak_allocated, allocated)
            lines.append(f"a {next_id} {size}")
            next_id += 1
        elif action == "free_completed":
            allocated -= live.pop(addr)
            lines.append(f"f {ids.pop(addr)}")
    header = [f"# {source}", f"# reserved_peak_bytes {reserved}", f"# allocated_peak_bytes {peak_allocated}",
              f"# events {len(lines)}"]
    return "\n".join(header + lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--source", default="allocator trace from tools/calibrate")
    a = ap.parse_args(argv)
    opener = gzip.open if a.trace.endswith(".gz") else open
    with opener(a.trace, "rt", encoding="utf-8") as f:
        trace = json.load(f)
    try:
        text = convert(trace, a.source)
    except ValueError as e:
        print(f"alloc_trace.py: {a.trace}: {e}", file=sys.stderr)
        return 2
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
