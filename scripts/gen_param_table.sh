#!/bin/sh
# gen_param_table.sh: the parameter table of docs/parameters.md, generated from the one parameter
# table (src/base/param_table.h) through `chorus_info --params --markdown`.
#
#   scripts/gen_param_table.sh [BUILD_DIR]            print the table (BUILD_DIR defaults to build)
#   scripts/gen_param_table.sh --update [BUILD_DIR]   rewrite the table in docs/parameters.md in
#                                                     place: the lines after the "params-table"
#                                                     marker up to the next blank line
#   scripts/gen_param_table.sh --check [BUILD_DIR]    exit 1 when docs/parameters.md is out of date
#                                                     (a ctest case runs this)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
mode=print
case "${1:-}" in
--update) mode=update; shift ;;
--check) mode=check; shift ;;
esac
build=${1:-$here/build}
info=$build/bin/chorus_info
if [ ! -x "$info" ]; then
    echo "gen_param_table.sh: $info not found; build first (cmake --build $build)" >&2
    exit 1
fi
# Defaults only: the table must not depend on the caller's environment.
table=$(env -i PATH="$PATH" "$info" --params --markdown)
if [ $mode = print ]; then
    printf '%s\n' "$table"
    exit 0
fi
doc=$here/docs/parameters.md
grep -q 'params-table' "$doc" || { echo "gen_param_table.sh: no params-table marker in $doc" >&2; exit 1; }
tmp=$(mktemp)
printf '%s\n' "$table" > "$tmp.table"
awk -v tf="$tmp.table" '
    skip && /^[[:space:]]*$/ { skip = 0 }
    skip { next }
    { print }
    /params-table/ { while ((getline l < tf) > 0) print l; skip = 1 }
' "$doc" > "$tmp"
rm -f "$tmp.table"
if [ $mode = check ]; then
    if cmp -s "$tmp" "$doc"; then
        rm -f "$tmp"
        exit 0
    fi
    echo "gen_param_table.sh: $doc does not match src/base/param_table.h:" >&2
    diff "$doc" "$tmp" >&2 || true
    echo "run scripts/gen_param_table.sh --update" >&2
    rm -f "$tmp"
    exit 1
fi
mv "$tmp" "$doc"
echo "gen_param_table.sh: updated $doc"
