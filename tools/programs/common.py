"""What the program generators (sd_unet.py, flux.py, sd3.py) share: writing their JSON, or checking it is current."""
import json
import os
import sys

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "core", "catalog", "architectures")


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
