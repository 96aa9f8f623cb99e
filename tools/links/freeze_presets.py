#!/usr/bin/env python3
"""Appends the catalogue's model presets to the frozen preset table of short links.

    python3 tools/links/freeze_presets.py build/native/memsim-cli [SCHEMA]

A short link may name its model by a catalogue id (`model=llama-3.1-70b`) instead of listing the model's fields.
What the id means is frozen in tests/golden/vN.presets.json (N: the config schema, the newest by default), so that a
link keeps its meaning when the catalogue is corrected later: each entry holds the model fields that differ from
tests/golden/vN.defaults.json. Entries are never changed or removed. This script only appends the supported presets
the table lacks, and lists the ones whose catalogue entry has changed since it was frozen (the link encoder then
writes the changed fields after the id, so such links stay correct, only longer).
"""
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def newest_schema():
    golden = os.path.join(ROOT, "tests", "golden")
    return max(int(f[1:].split(".")[0]) for f in os.listdir(golden) if f.endswith(".defaults.json"))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    cli = sys.argv[1]
    schema = int(sys.argv[2]) if len(sys.argv) > 2 else newest_schema()
    defaults_path = os.path.join(ROOT, "tests", "golden", "v%d.defaults.json" % schema)
    table_path = os.path.join(ROOT, "tests", "golden", "v%d.presets.json" % schema)
    defaults = json.load(open(defaults_path))["model"]
    table = json.load(open(table_path)) if os.path.exists(table_path) else {}
    ids = [line.split()[0] for line in subprocess.check_output([cli, "presets"], text=True).splitlines()
           if line.strip() and "not simulated" not in line]
    added, changed = [], []
    for pid in ids:
        # The model fields do not depend on the training section, but the CLI prints only a config that validates:
        # a model of 512 positions (BERT) needs a shorter sequence than the default.
        run = subprocess.run([cli, "config", "--preset", pid, "--format", "json"], text=True, capture_output=True)
        if run.returncode != 0:
            run = subprocess.run([cli, "config", "--preset", pid, "--set", "training.sequence_length=512", "--format", "json"],
                                 text=True, capture_output=True, check=True)
        model = json.loads(run.stdout)["model"]
        entry = {k: v for k, v in model.items() if defaults.get(k) != v}
        if pid not in table:
            table[pid] = entry
            added.append(pid)
        elif table[pid] != entry:
            changed.append(pid)
    # One preset per line: a diff shows which entry was appended.
    lines = ["  %s: %s" % (json.dumps(pid), json.dumps(entry, ensure_ascii=False)) for pid, entry in table.items()]
    with open(table_path, "w") as f:
        f.write("{\n" + ",\n".join(lines) + "\n}\n")
    print("freeze_presets: %d presets in %s, %d appended%s" % (len(table), os.path.relpath(table_path, ROOT), len(added),
                                                               (": " + ", ".join(added)) if added else ""))
    for pid in changed:
        print("freeze_presets: %s differs from its frozen entry now; the entry is kept (links stay as they were)" % pid)


if __name__ == "__main__":
    main()
