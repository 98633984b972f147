#!/usr/bin/env bash
# Install nemo-vfm as a package: build the wheel from this checkout, install it (not editable) into a fresh
# virtual environment, then check the install from a folder outside the checkout (check_install.py: every file,
# `vfm --help`, every import, a 2-step quickstart training on the CPU). CI runs this (.ci/run); the container
# image for the Slurm and Kubernetes executors is built with it (Dockerfile beside this script).
#
#   bash launchers/container/install.sh VENV        # VENV must not exist yet
#
# Settings (environment):
#   PYTHON=python3        the interpreter that creates VENV
#   TORCH_SPEC=...        the torch installed first (default: "torch>=2.11" where nvidia-smi sees a GPU, else
#                         torch==2.13.0); every later install is pinned to it through a constraints file
#   EXTRAS=               extras installed with the wheel, e.g. "pretrained,k8s" (none by default)
#   CHECK=1               0 skips the check
set -euo pipefail

VENV=${1:?usage: install.sh VENV (a folder that does not exist yet)}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-python3}
if [[ -e "$VENV" ]]; then
  echo "error: $VENV exists; remove it or name a new folder (the install goes into a fresh environment)" >&2
  exit 2
fi
if [[ -z "${TORCH_SPEC:-}" ]]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then TORCH_SPEC="torch>=2.11"
  else TORCH_SPEC="torch==2.13.0"; fi
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
start=$SECONDS

echo "== fresh environment $VENV, $TORCH_SPEC"
"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q $TORCH_SPEC
"$VENV/bin/python" -W ignore -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > "$VENV/constraints.txt"

echo "== wheel (built from a clean copy of the package sources)"
mkdir "$WORK/src"
(cd "$REPO" && tar -c --exclude=__pycache__ --exclude='*.py[co]' setup.py pyproject.toml README.md nemo_vfm recipes) \
  | tar -x -C "$WORK/src"
"${PIP[@]}" wheel -q --no-deps -w "$WORK/dist" "$WORK/src"
WHEEL=$(ls "$WORK"/dist/nemo_vfm-*.whl)
echo "   $(basename "$WHEEL")"

echo "== install (not editable)"
"${PIP[@]}" install -q -c "$VENV/constraints.txt" "$WHEEL${EXTRAS:+[$EXTRAS]}"
echo "   installed in $((SECONDS - start)) s"

if [[ "${CHECK:-1}" != 0 ]]; then
  echo "== check, from $WORK/outside"
  mkdir "$WORK/outside"
  (cd "$WORK/outside" && env -u PYTHONPATH PYTHONNOUSERSITE=1 "$VENV/bin/python" \
    "$REPO/launchers/container/check_install.py" --source "$REPO")
fi
echo "== done in $((SECONDS - start)) s: $VENV/bin/vfm"
