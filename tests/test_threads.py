"""Every program shares the CPU by one rule (common/threads.py): OpenMP's passive wait
policy in place before torch loads, and torch's thread count from --threads, else the
user's OMP_NUM_THREADS, else the default measured for the program's kind of work. Each
case runs in a fresh process, where torch has not loaded yet."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

# Records the wait policy at the moment torch is first imported, runs the program's main
# with ARGS (its input is missing, so it stops with exit 2 right after choosing its
# threads), and prints what it left.
SCRIPT = """
import importlib.abc, json, os, sys
sys.path.insert(0, {root!r})
seen = {{}}

class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch" and "policy" not in seen:
            seen["policy"] = os.environ.get("OMP_WAIT_POLICY")
        return None

sys.meta_path.insert(0, Watch())
import {program}
code = {program}.main({args!r})
import torch
print(json.dumps({{"code": code, "policy_when_torch_loaded": seen.get("policy"), "threads": torch.get_num_threads()}}))
"""

MISSING = str(ROOT / "no-such-run")
ARGS = {
    "train": ["--config", str(ROOT / "configs" / "tiny.yaml"), f"data.source={MISSING}.txt", "train.threads=0",
              f"out_dir={MISSING}"],
    "generate": ["--checkpoint", MISSING, "--prompt", "A"],
    "evaluate": ["--checkpoint", MISSING, "--split", "val"],
    "explore": ["--checkpoint", MISSING, "--prompt", "A", "--out", f"{MISSING}.html"],
    "export": ["--checkpoint", MISSING, "--out", f"{MISSING}-hf"],
}
DEFAULT = {"train": os.cpu_count(), "evaluate": os.cpu_count(), "generate": 1, "explore": 1, "export": 1}


def run(program: str, args: list[str], **env: str) -> dict:
    environment = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")} | env
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(root=str(ROOT), program=program, args=args)],
                         cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("program", list(ARGS))
def test_each_program_sets_the_policy_before_torch_and_its_threads(program):
    default = run(program, ARGS[program])
    assert default == {"code": 2, "policy_when_torch_loaded": "PASSIVE", "threads": DEFAULT[program]}
    chosen = run(program, [*ARGS[program], "--threads", "3"])
    assert chosen["threads"] == 3


def test_the_users_environment_comes_before_the_defaults():
    """torchrun sets OMP_NUM_THREADS=1 for each worker; a user may want OpenMP to spin."""
    assert run("generate", ARGS["generate"], OMP_NUM_THREADS="2", OMP_WAIT_POLICY="ACTIVE") == \
        {"code": 2, "policy_when_torch_loaded": "ACTIVE", "threads": 2}
    assert run("train", ARGS["train"], OMP_NUM_THREADS="1")["threads"] == 1
    assert run("train", [*ARGS["train"][:-2], "train.threads=2", ARGS["train"][-1]], OMP_NUM_THREADS="1")["threads"] == 2
