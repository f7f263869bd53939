#!/usr/bin/env python3
"""check_layers.py: no file under src/ includes a header of a layer above its own.

The layers, bottom to top (docs/architecture.md):

    base < bootstrap < topology < transport < collectives < device < api

src/<layer>/ and everything below it belongs to <layer>. A quoted #include is resolved the way
the build resolves it: first next to the including file, then in include/ (the installed headers,
which every layer may use), then in src/<layer>/ of each layer (the build's include path), then
relative to src/ ("topology/topo_internal.h"). Every include must resolve to exactly one file, and
every header must live in a layer's folder: a header in src/include/ or another folder without a
layer has no owner and fails the check. A header named *_internal.h is private to its layer: no
other layer may include it, not even one above. src/ddp/ is a client of the library: it may
include the installed headers and its own only.

There are no exceptions: a lower layer that needs something from above is handed it (a narrow
struct, arguments, a callback), as the transports get a context instead of the communicator and
the topology gives the collectives rings instead of writing channels.

Usage: check_layers.py [--root DIR] | --selftest
Exit status 0 when clean, 1 with one line per problem.
"""
import argparse
import os
import re
import sys
import tempfile

LAYERS = ["base", "bootstrap", "topology", "transport", "collectives", "device", "api"]
CLIENT = "ddp"  # sees the installed headers only
SOURCE_EXT = (".c", ".h", ".cu", ".cuh", ".cc", ".cpp")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(rel):
    """The layer of a path relative to the root, "public" for include/, None when it has none."""
    parts = rel.split("/")
    if parts[0] == "include" and len(parts) == 2:
        return "public"
    if parts[0] == "src" and len(parts) >= 3:
        if parts[1] in LAYERS or parts[1] == CLIENT:
            return parts[1]
    return None


def resolve(root, rel_file, name):
    """The files (relative to root) that #include "name" in rel_file can mean, in search order
    groups: the first non-empty group wins, and it must hold one file."""
    here = os.path.dirname(rel_file)
    groups = [[os.path.join(here, name)], [os.path.join("include", name)],
              [os.path.join("src", l, name) for l in LAYERS], [os.path.join("src", name)]]
    for group in groups:
        found = sorted({os.path.normpath(p) for p in group
                        if os.path.isfile(os.path.join(root, p))})
        if found:
            return found
    return []


def check(root):
    problems = []
    src = os.path.join(root, "src")
    for dirpath, _, files in os.walk(src):
        for f in sorted(files):
            if not f.endswith(SOURCE_EXT):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), root)
            mine = layer_of(rel)
            if mine is None:
                problems.append(f"{rel}: not in a layer's folder (src/<layer>/, layers: "
                                f"{', '.join(LAYERS)}); move it next to its layer")
                continue
            with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
                text = fh.read()
            for name in INCLUDE_RE.findall(text):
                targets = resolve(root, rel, name)
                if not targets:
                    problems.append(f'{rel}: #include "{name}" matches no file in the tree')
                    continue
                if len(targets) > 1:
                    problems.append(f'{rel}: #include "{name}" is ambiguous: {", ".join(targets)}')
                    continue
                target = targets[0]
                theirs = layer_of(target)
                if theirs is None:
                    problems.append(f'{rel}: #include "{name}" -> {target}, which has no layer')
                    continue
                if theirs == "public" or theirs == mine:
                    continue
                if os.path.basename(target).endswith("_internal.h"):
                    problems.append(f"{rel} ({mine}) includes {target}, which is private to "
                                    f"{theirs}")
                    continue
                if mine == CLIENT or theirs == CLIENT:
                    problems.append(f"{rel} ({mine}) includes {target} ({theirs}): src/ddp sees "
                                    "the installed headers only")
                    continue
                if LAYERS.index(theirs) < LAYERS.index(mine):
                    continue
                problems.append(f"{rel} ({mine}) includes {target} ({theirs}): upward edge; hand "
                                f"{mine} what it needs from {theirs} instead")
    return problems


def selftest():
    """The check on small trees: a clean one passes, each kind of fault is found."""
    def tree(files):
        d = tempfile.mkdtemp(prefix="check_layers_")
        for path, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(d, path)), exist_ok=True)
            with open(os.path.join(d, path), "w") as fh:
                fh.write(text)
        return d

    base = {
        "include/nccl.h": "",
        "src/base/log.h": '#include "nccl.h"\n',
        "src/transport/transport.h": '#include "log.h"\n',
        "src/api/init.c": '#include "transport.h"\n#include "log.h"\n',
        "src/ddp/ddp.c": '#include "nccl.h"\n',
    }
    cases = [
        ("clean", {}, 0),
        ("upward edge", {"src/base/log.c": '#include "transport.h"\n'}, 1),
        ("header without a layer", {"src/include/x.h": ""}, 1),
        ("unresolved include", {"src/base/y.c": '#include "nothere.h"\n'}, 1),
        ("client sees internals", {"src/ddp/d.c": '#include "log.h"\n'}, 1),
        ("private header", {"src/base/b_internal.h": "",
                            "src/api/x.c": '#include "b_internal.h"\n'}, 1),
        ("transport includes collectives", {"src/collectives/reduce.h": "",
                                            "src/transport/shm/p.c": '#include "reduce.h"\n'}, 1),
        ("topology includes the communicator", {"src/collectives/comm.h": "",
                                                "src/topology/rings.c": '#include "comm.h"\n'}, 1),
        ("api includes topology", {"src/topology/topo.h": "",
                                   "src/api/x.c": '#include "topo.h"\n'}, 0),
    ]
    failed = 0
    for name, extra, want in cases:
        got = check(tree({**base, **extra}))
        ok = len(got) == want
        failed += not ok
        print(f"selftest {name}: {'ok' if ok else 'FAILED'} ({len(got)} problem(s), want {want})")
        for p in got:
            print("   ", p)
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    ap.add_argument("--selftest", action="store_true", help="check the checker on small trees")
    args = ap.parse_args()
    if args.selftest:
        return selftest()
    problems = check(os.path.abspath(args.root))
    for p in problems:
        print(p)
    print(f"check_layers: {len(problems)} problem(s); layers bottom to top: {' < '.join(LAYERS)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
