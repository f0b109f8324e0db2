"""Every benchmark's --quick mode runs and writes its JSON, so the scripts never rot.
(The figures themselves are not checked: speed is measured in bench/, not asserted.)"""

import json
import math
import os
import subprocess
import sys

import pytest

from conftest import ROOT

SCRIPTS = ["train_throughput", "decode", "learning", "memory", "gpu", "explorer", "prepare", "snapshots", "finetune",
           "induction", "packing", "sft", "dpo",
           # (torchrun's processes: one such test at a time, tests/test_distributed.py)
           pytest.param("elastic", marks=pytest.mark.xdist_group("processes"))]


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_quick_mode(tmp_path, name):
    pytest.importorskip("transformers")
    if name in ("sft", "dpo"):
        pytest.importorskip("trl")
    if name == "explorer" and not os.path.exists("/usr/bin/chromium") and os.environ.get("CI") != "true":
        pytest.skip("no Chromium: apt-get install -y chromium")
    out = tmp_path / f"{name}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # as if run from the repository root
    result = subprocess.run([sys.executable, "-m", f"bench.{name}", "--quick", "--out", str(out)],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "|---" in result.stdout  # a markdown table
    payload = json.loads(out.read_text())
    assert payload["results"] and payload["machine"]["torch"]
    measured = list(numbers(payload["results"]))  # what it measured: finite, and not all zero
    assert measured and all(math.isfinite(value) for value in measured) and any(value > 0 for value in measured)


def numbers(value):
    """Every number in a benchmark's results, however nested."""
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            yield from numbers(item)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield value
