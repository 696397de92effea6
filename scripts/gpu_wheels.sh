#!/usr/bin/env bash
# The wheels scripts/gpu_check.sh carries to a GPU machine that has torch and transformers but no network and
# none of this package's other needs: the versions of requirements/cpu-lock.txt, built for Python 3.12 on x86-64.
#   bash scripts/gpu_wheels.sh            # into .whl/ (ignored by git), then run scripts/gpu_check.sh there
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PY_VERSION="${GPU_PY_VERSION:-3.12}"
mkdir -p .whl
rm -f .whl/*.whl
pinned() { grep -i "^$1==" requirements/cpu-lock.txt; }
# The test module's imports that the GPU image lacks (its pip list: docs/history/benchmarks.md section 7).
for name in bm25s faiss-cpu megatron-core; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl "$(pinned "$name")"
done
du -ch .whl/*.whl | tail -n 1
