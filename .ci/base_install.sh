#!/usr/bin/env bash
# A base install runs jobs: `pip install .` alone (no extras: the dev extras can hide a missing runtime
# dependency, as onnxruntime once was) into a fresh venv, then `kiln tune` end to end and a job submitted to
# `kiln serve` over HTTP (.ci/base_install_job.py, standard library only), both from outside the checkout.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/kiln-base.XXXXXX)
trap 'rm -rf "$work"' EXIT

python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check "$repo"
# What the extras bring must really be missing, or this proves nothing.
"$work/venv/bin/python" - <<'PY'
import importlib.util
present = [m for m in ("pytest", "torch", "jax", "httpx", "playwright") if importlib.util.find_spec(m)]
assert not present, f"a base install should not have {present}"
PY

cd "$work"  # the installed package, not the checkout's sources
export KILN_DATA_DIR="$work/data"
unset KILN_DATABASE_URL
"$work/venv/bin/kiln" tune "$repo/examples/mlp.onnx" --trials 8 --out "$work/out"
ls "$work"/out/mlp-*.tar.gz >/dev/null
"$work/venv/bin/python" "$repo/.ci/base_install_job.py" "$work/venv/bin/kiln" "$repo/examples/small_cnn.onnx"
echo "base install: kiln tune and a job through kiln serve succeeded"
