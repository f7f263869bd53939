#!/bin/sh
# gen_param_table.sh: print the README's parameter table, generated from the one parameter table
# (src/include/param_table.h) through `chorus_info --params --markdown`.
#
#   scripts/gen_param_table.sh [BUILD_DIR]            print the table (BUILD_DIR defaults to build)
#   scripts/gen_param_table.sh --update [BUILD_DIR]   rewrite the table in README.md in place: the
#                                                     lines after the "params-table" marker up to
#                                                     the next blank line
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
update=0
if [ "${1:-}" = "--update" ]; then
    update=1
    shift
fi
build=${1:-$here/build}
info=$build/bin/chorus_info
if [ ! -x "$info" ]; then
    echo "gen_param_table.sh: $info not found; build first (cmake --build $build)" >&2
    exit 1
fi
# Defaults only: the table must not depend on the caller's environment.
table=$(env -i PATH="$PATH" "$info" --params --markdown)
if [ $update -eq 0 ]; then
    printf '%s\n' "$table"
    exit 0
fi
readme=$here/README.md
grep -q 'params-table' "$readme" || { echo "gen_param_table.sh: no params-table marker in $readme" >&2; exit 1; }
tmp=$(mktemp)
printf '%s\n' "$table" > "$tmp.table"
awk -v tf="$tmp.table" '
    skip && /^[[:space:]]*$/ { skip = 0 }
    skip { next }
    { print }
    /params-table/ { while ((getline l < tf) > 0) print l; skip = 1 }
' "$readme" > "$tmp"
mv "$tmp" "$readme"
rm -f "$tmp.table"
echo "gen_param_table.sh: updated $readme"
