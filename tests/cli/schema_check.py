#!/usr/bin/env python3
"""The config's JSON Schema (docs/config.schema.json, generated from the field registry by `memsim-cli schema`)
against an independent validator, Debian's python3-jsonschema:
  1. the checked-in file is what the CLI prints now;
  2. it is a valid draft 2020-12 schema;
  3. every config memsim ships (the validation cases, the golden files, `memsim-cli config`) is valid under it;
  4. for every field with a range or a list of values, the value just outside it is refused by the schema and by
     memsim alike (exit 2 with one line naming the field), and the default is accepted by both.
Run: MEMSIM_CLI=build/native/memsim-cli /usr/bin/python3 tests/cli/schema_check.py"""
import glob, json, os, subprocess, sys

try:
    import jsonschema
except ImportError:
    sys.exit("schema_check: python3-jsonschema is missing (scripts/deps.sh installs it for /usr/bin/python3)")

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))
cli = os.environ.get("MEMSIM_CLI", os.path.join(root, "build/native/memsim-cli"))
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg)


printed = subprocess.run([cli, "schema"], capture_output=True, text=True, check=True).stdout
with open(os.path.join(root, "docs/config.schema.json")) as f:
    if f.read() != printed:
        fail("docs/config.schema.json is not current: run memsim-cli schema > docs/config.schema.json")
schema = json.loads(printed)
jsonschema.Draft202012Validator.check_schema(schema)
validator = jsonschema.Draft202012Validator(schema)


def schema_errors(config):
    return [e.message for e in validator.iter_errors(config)]


configs = []
for path in sorted(glob.glob(os.path.join(root, "tests/validation/cases/**/*.json"), recursive=True)):
    with open(path) as f:
        doc = json.load(f)
    for case in doc if isinstance(doc, list) else doc.get("cases", [doc]):
        if isinstance(case, dict) and "config" in case:
            configs.append((f"{os.path.relpath(path, root)} {case.get('id', '')}", case["config"]))
for name in ("v1", "v2"):
    for suffix in (".json", ".defaults.json", ".expected.json"):
        path = os.path.join(root, "tests/golden", name + suffix)
        with open(path) as f:
            doc = json.load(f)
        if name == "v1":
            doc.pop("schema", None)  # schema 1's files are valid under the current schema once migrated: fields only
        configs.append((os.path.relpath(path, root), doc))
configs.append(("memsim-cli config", json.loads(subprocess.run([cli, "config"], capture_output=True, text=True,
                                                               check=True).stdout)))
for name, config in configs:
    errors = schema_errors(config)
    if errors:
        fail(f"{name}: not valid under the schema: {errors[0][:160]}")

# 4. Outside each field's range or list: refused by both. The base is a LoRA run, so that peft's fields apply.
base = ["peft.method=lora"]


def memsim_refuses(key, value):
    text = value if isinstance(value, str) else json.dumps(value)
    r = subprocess.run([cli, "estimate", "--format", "json", "--set", base[0], "--set", f"{key}={text}"],
                       capture_output=True, text=True)
    return r.returncode == 2 and key in r.stderr, r


default = json.loads(subprocess.run([cli, "config", "--set", base[0]], capture_output=True, text=True,
                                    check=True).stdout)
checked = 0
for section, sec_schema in schema["properties"].items():
    if section == "schema":
        continue
    for field, prop in sec_schema["properties"].items():
        key = f"{section}.{field}"
        outside = []
        if "maximum" in prop and prop.get("type") == "integer":
            outside += [prop["maximum"] + 1, prop["minimum"] - 1]
        if "enum" in prop and all(isinstance(v, str) for v in prop["enum"]):
            outside.append("not_a_choice")
        for value in outside:
            checked += 1
            config = json.loads(json.dumps(default))
            config[section][field] = value
            if not schema_errors(config):
                fail(f"{key}={value}: the schema accepts it")
            refused, r = memsim_refuses(key, value)
            if not refused:
                fail(f"{key}={value}: memsim does not refuse it (exit {r.returncode}: {r.stderr.strip()[:160]})")
print(f"schema_check: {len(configs)} configs valid, {checked} out-of-range values refused by both,",
      "failures:", len(failures))
sys.exit(1 if failures else 0)
