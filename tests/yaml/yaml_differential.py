#!/usr/bin/env python3
"""Differential test of memsim's YAML subset reader (src/core/yaml_subset.h) against Debian's python3-yaml
(yaml.safe_load, YAML 1.1 as PyYAML resolves it):
  - every Accelerate config of the corpus (tests/data/accelerate/*.yaml, tests/yaml/corpus/*.yaml) reads the same,
    value for value and type for type (an int is not a float, a bool not an int);
  - every file of tests/yaml/refused/ uses a feature outside the subset and is refused with its line;
  - each scalar spelling of SCALARS, as "key: <scalar>", reads the same as PyYAML reads it, or is refused where
    PyYAML gives something the subset leaves out (NaN, infinity, base-60 numbers, dates).
Run: MEMSIM_YAML_DUMP=build/native/memsim_yaml_dump /usr/bin/python3 tests/yaml/yaml_differential.py"""
import datetime, glob, json, math, os, subprocess, sys, tempfile

try:
    import yaml
except ImportError:
    sys.exit("yaml_differential: python3-yaml is missing (scripts/deps.sh installs it for /usr/bin/python3)")

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))
dump = os.environ.get("MEMSIM_YAML_DUMP", os.path.join(root, "build/native/memsim_yaml_dump"))
failures = []


def memsim_read(path):
    out = subprocess.run([dump, path], capture_output=True, text=True, check=True).stdout.rstrip("\n")
    if out.startswith("refused: "):
        return None, out[len("refused: "):]
    return json.loads(out), None


def same(a, b):
    """Equal with the same JSON types (PyYAML's int vs float, bool vs int kept apart)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def check_file(path, expect_refused=False):
    ours, refusal = memsim_read(path)
    with open(path, "rb") as f:
        text = f.read().decode("utf-8")
    if expect_refused:
        if refusal is None or "line " not in refusal:
            failures.append(f"{path}: should be refused with its line; read as {ours}")
        return
    try:
        theirs = yaml.safe_load(text)
    except yaml.YAMLError as e:
        failures.append(f"{path}: the corpus file is not YAML: {e}")
        return
    if refusal is not None:
        failures.append(f"{path}: refused ({refusal}) but PyYAML reads it")
    elif not same(ours, theirs):
        failures.append(f"{path}: reads {json.dumps(ours)[:300]}\n    PyYAML {theirs!r:.300}")


corpus = sorted(glob.glob(os.path.join(root, "tests/data/accelerate/*.yaml")) + glob.glob(os.path.join(here, "corpus/*.yaml")))
refused = sorted(glob.glob(os.path.join(here, "refused/*.yaml")))
for path in corpus:
    check_file(path)
for path in refused:
    check_file(path, expect_refused=True)

# Plain and quoted scalars as PyYAML resolves them (yaml/resolver.py: bool, int, float, null, timestamp).
SCALARS = [
    "true", "True", "TRUE", "false", "yes", "Yes", "no", "NO", "on", "On", "off", "OFF", "y", "n", "Y",
    "null", "Null", "~", "", "0", "-0", "+0", "7", "-7", "+7", "42", "9007199254740992",
    "1.0", "-1.5", "+2.25", ".5", "5.", "1.0e+5", "1.0E-3", "-2.5e10", "1e5", "1E5", "1_000", "1_000.5",
    "010", "0o17", "0x1F", "0b101", "1:30", "2024-05-01", ".inf", "-.inf", ".nan", ".NaN",
    "bf16", "fp8", "FULL_SHARD", "BACKWARD_PRE", "LlamaDecoderLayer", "all", "0,1,2", "a:b", "http://x.org/a",
    "(false, false, false)", "3.10.12", "v1.2", "-", "- x", "a #comment", "'quoted'", "'it''s'", '"double"',
    '"esc \\" \\\\ \\n"', '"\\u00e9\\x41"', "'no'", '"yes"', "'010'", "[]", "{}", "[1, two, 'three', 4.0]",
    "[ a , b ]", "&a 1", "*a", "!!str 1", "|", ">", "@x", "`x", "%x", "a: b",
    "-.5", "+.5", "1._5", "0.5e-3", "-0x1F", "+010", "0_1", "08", "0b", "1:70", "12:30:45", "2024-5-1", "2024-5-1 10:00:00", "2024-05-01T10:00:00Z", "2001-12-14 21:59:43.10 -5",
]
NO_VALUE = (datetime.date, datetime.datetime)  # timestamps: JSON has no such value
with tempfile.TemporaryDirectory() as tmp:
    for i, s in enumerate(SCALARS):
        path = os.path.join(tmp, f"s{i}.yaml")
        with open(path, "w") as f:
            f.write(f"key: {s}\n")
        ours, refusal = memsim_read(path)
        try:
            theirs = yaml.safe_load(f"key: {s}\n")
        except yaml.YAMLError:
            if refusal is None:
                failures.append(f"scalar {s!r}: PyYAML refuses it, memsim reads {ours}")
            continue
        value = theirs["key"] if isinstance(theirs, dict) else theirs
        no_value = isinstance(value, NO_VALUE) or (isinstance(value, float) and not math.isfinite(value))
        if refusal is not None:
            # Refusing is right only for what the subset leaves out: values JSON cannot hold, and YAML features.
            base60 = ":" in s and isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (no_value or base60 or s[:1] in "&*!|>@`%" or isinstance(value, dict) and value):
                failures.append(f"scalar {s!r}: refused ({refusal}) but PyYAML reads {value!r}")
        elif no_value:
            failures.append(f"scalar {s!r}: PyYAML reads {value!r}, which has no JSON value; memsim reads {ours}")
        elif not same(ours["key"], value):
            failures.append(f"scalar {s!r}: memsim reads {json.dumps(ours['key'])}, PyYAML {value!r}")

for f in failures:
    print("FAIL:", f)
print(f"yaml_differential: {len(corpus)} configs, {len(refused)} refused files, {len(SCALARS)} scalars;",
      f"{len(failures)} failures")
sys.exit(1 if failures else 0)
