"""Every benchmark's --quick mode runs and writes its JSON, so the scripts never rot.
(The figures themselves are not checked: speed is measured in bench/, not asserted.)"""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

SCRIPTS = ["train_throughput", "decode", "learning", "memory", "gpu", "explorer", "elastic", "prepare", "snapshots",
           "finetune", "induction"]


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_quick_mode(tmp_path, name):
    pytest.importorskip("transformers")
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
    measured = [r[key] for r in payload["results"] for key in ("peak_rss_mb", "tokens_per_sec") if key in r]
    assert measured and all(value > 0 for value in measured)
