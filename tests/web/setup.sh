#!/usr/bin/env bash
# The browser test's Python: a venv at $CARGO_TARGET_DIR/web-venv (default
# target/web-venv) with Playwright from requirements.txt. Idempotent: does
# nothing when the venv matches requirements.txt. Run by
# scripts/install-deps.sh, and by tests/tests/web_console.rs before it
# starts. Playwright's own browser downloads are not used: the test launches
# Debian's chromium, which scripts/install-deps.sh installs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
case "$target" in /*) ;; *) target="$root/$target" ;; esac
VENV=$target/web-venv
STAMP=$VENV/.requirements.sha256
want=$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)
if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
    exit 0
fi
mkdir -p "$target"
rm -rf "$VENV"
python3 -m venv "$VENV"
PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 "$VENV/bin/python" -m pip install --quiet \
    --disable-pip-version-check --no-input --no-deps -r "$here/requirements.txt"
"$VENV/bin/python" -m pip check >/dev/null
echo "$want" >"$STAMP"
echo "tests/web: $VENV built"
