#!/usr/bin/env python3
"""check_symbols.py: no object of a layer calls a function (or reads a variable) of a layer above.

check_layers.py checks the includes; this checks what the includes cannot show: a declaration
written by hand in a lower layer (or in a header of the wrong layer) of a function that a higher
layer defines. It reads the library's compiled objects with nm: every global symbol an object of
src/<layer>/ leaves undefined must not be defined by an object of a higher layer. The layers, bottom
to top (docs/architecture.md):

    base < bootstrap < topology < transport < collectives < device < api

Usage: check_symbols.py --objdir BUILD/CMakeFiles/chorus_obj.dir --root SOURCE_DIR | --selftest
Objects whose source file no longer exists (left in a build tree by a removed file) are ignored.
Exit status 0 when clean, 1 with one line per upward call.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

LAYERS = ["base", "bootstrap", "topology", "transport", "collectives", "device", "api"]


def objects(objdir, root):
    """(source path relative to root, layer, object path) for each object of a layer's source."""
    found = []
    for dirpath, _, files in os.walk(os.path.join(objdir, "src")):
        for f in sorted(files):
            if not f.endswith(".o"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f[:-2]), objdir)  # src/<layer>/.../x.c
            parts = rel.split(os.sep)
            if len(parts) < 3 or parts[1] not in LAYERS:
                continue
            if not os.path.isfile(os.path.join(root, rel)):
                continue
            found.append((rel, parts[1], os.path.join(dirpath, f)))
    return found


def symbols(paths, undefined):
    """path -> the global symbols it defines (or leaves undefined), from one nm run over all
    paths (one process per object took a minute on a loaded 2-core machine)."""
    out = subprocess.run(["nm", "-A", "-u" if undefined else "--defined-only", "-g", *paths],
                         capture_output=True, text=True, check=True).stdout
    found = {path: set() for path in paths}
    for line in out.splitlines():
        path, _, rest = line.partition(":")
        if rest.strip() and path in found:
            found[path].add(rest.split()[-1])
    return found


def check(objdir, root):
    objs = objects(objdir, root)
    if not objs:
        return [f"no objects of any layer under {objdir}/src: build the library first"], 0
    paths = [path for _, _, path in objs]
    defined, undefined = symbols(paths, False), symbols(paths, True)
    owner = {}
    for rel, layer, path in objs:
        for s in defined[path]:
            owner[s] = (layer, rel)
    problems = []
    for rel, layer, path in objs:
        for s in sorted(undefined[path]):
            if s in owner and LAYERS.index(owner[s][0]) > LAYERS.index(layer):
                problems.append(f"{rel} ({layer}) uses {s}, defined in {owner[s][1]} "
                                f"({owner[s][0]}): an upward call")
    return problems, len(objs)


def selftest():
    """A base object calling an api function must be found; the other way round must not."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        print("selftest: no C compiler")
        return 1
    with tempfile.TemporaryDirectory() as root:
        files = {"src/base/low.c": "int high(void); int low(void) { return high(); }\n",
                 "src/api/high.c": "int low(void); int high(void) { return 1; }\n"
                                   "int top(void) { return low(); }\n"}
        objdir = os.path.join(root, "obj")
        for rel, text in files.items():
            src = os.path.join(root, rel)
            os.makedirs(os.path.dirname(src), exist_ok=True)
            with open(src, "w") as f:
                f.write(text)
            obj = os.path.join(objdir, rel + ".o")
            os.makedirs(os.path.dirname(obj), exist_ok=True)
            subprocess.run([cc, "-c", src, "-o", obj], check=True)
        problems, n = check(objdir, root)
        want = "src/base/low.c (base) uses high, defined in src/api/high.c (api): an upward call"
        if n != 2 or problems != [want]:
            print(f"selftest failed: {n} objects, {problems}")
            return 1
    print("selftest: the upward call was found, the downward one was not")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--objdir")
    p.add_argument("--root")
    p.add_argument("--selftest", action="store_true")
    a = p.parse_args()
    if a.selftest:
        return selftest()
    if not a.objdir or not a.root:
        p.error("--objdir and --root, or --selftest")
    problems, n = check(a.objdir, a.root)
    for line in problems:
        print(line)
    print(f"{n} objects, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
