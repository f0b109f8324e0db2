"""The figures of docs/architecture.md, measured from the code: non-blank lines per folder,
the newcomer's path, the import closure of each program (every project module it imports,
directly or not, at any depth, lazy imports inside functions included), the Trainer's
attributes, and, traced while a micro run trains (sys.settrace), the project files and
lines one iteration runs: a plain one, one that keeps a snapshot, one that evaluates and
saves; and those a resume runs.

    python docs/layout_figures.py [ROOT]      # ROOT: a checkout (default: this one)
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import os
import sys
from pathlib import Path
from typing import Callable

PACKAGES = ("storage", "cli", "machine", "model", "data", "runs", "lora", "jobs", "inspection", "interop", "training",
            "explorer")
PROGRAMS = ("train", "generate", "evaluate", "export", "explore")
NEWCOMER = ("model", "data", "train.py", "generate.py")  # and the training loop with what it calls


def lines(path: Path) -> int:
    return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())


def module_path(root: Path, name: str) -> Path | None:
    """model.gpt -> model/gpt.py, model -> model/__init__.py, train -> train.py."""
    parts = name.split(".")
    for candidate in (root.joinpath(*parts).with_suffix(".py"), root.joinpath(*parts, "__init__.py")):
        if candidate.is_file():
            return candidate
    return None


def imports(root: Path, path: Path) -> set[Path]:
    """The project files `path` imports, anywhere in it (a package's __init__ included)."""
    package = path.parent.relative_to(root).parts
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + ((node.module,) if node.module else ())) \
                if node.level else node.module
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        for name in names:
            parts = name.split(".")
            for depth in range(1, len(parts) + 1):  # importing a.b runs a/__init__.py too
                target = module_path(root, ".".join(parts[:depth]))
                if target is not None and target != path:
                    found.add(target)
    return found


def closure(root: Path, start: Path) -> set[Path]:
    seen, todo = set(), [start]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        todo.extend(imports(root, path) - seen)
    return seen


def loaded(root: Path, program: str) -> set[Path]:
    """The project files a fresh interpreter has loaded once `program` is imported (what it
    runs before its first call: the imports inside functions that it does not reach are not)."""
    import subprocess

    code = ("import sys\nimport " + program + "\nprint('\\n'.join(m.__file__ for m in list(sys.modules.values()) "
            "if getattr(m, '__file__', None)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True).stdout
    files = {Path(line).resolve() for line in out.splitlines()}
    return {path for path in files if path.is_relative_to(root) and path.is_file() and ".venv" not in path.parts}


def trainer_attributes(root: Path) -> list[str]:
    """The attributes Trainer's methods set on self."""
    for node in ast.parse((root / "training" / "trainer.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef) and node.name == "Trainer":
            return sorted({n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                           and isinstance(n.value, ast.Name) and n.value.id == "self"})
    return []


def traced(root: Path, run, start: Callable[[object], bool]) -> dict[str, set]:
    """Run `run()` under a tracer; each time `start(frame)` says so, a new stretch begins,
    named by what start returned: {name: the (file, line) pairs of the project it ran}."""
    import os

    prefix = str(root) + os.sep
    seen: dict[str, set] = {}
    current = [None]

    def tracer(frame, event, arg):
        name = start(frame) if event == "call" else None
        if name is not None:
            current[0] = name if name else None
        path = frame.f_code.co_filename
        if current[0] is not None and path.startswith(prefix) and "site-packages" not in path and event in ("line", "call"):
            seen.setdefault(current[0], set()).add((path[len(prefix):], frame.f_lineno))
        return tracer

    sys.settrace(tracer)
    try:
        run()
    finally:
        sys.settrace(None)
    return seen


def iteration_figures(root: Path) -> dict[str, tuple[int, int, int, int]]:
    """(files, lines, files outside model/, lines outside model/) one iteration of a micro
    run runs: a plain one (the fourth), one that keeps a snapshot (the fifth: step 5) and one
    that evaluates and saves (the eighth); and those Trainer.resume and resume.check run."""
    import tempfile

    sys.path.insert(0, str(root))
    import torch
    from training.config import load_config
    from training.preparation import prepare_run
    from training.trainer import Trainer

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "text.txt"
        text.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(400)))
        cfg = load_config(root / "configs" / "tiny.yaml", [
            f"data.source={text}", "data.tokenizer=char", f"out_dir={tmp}/run", "train.max_minutes=null",
            "train.max_iters=8", "train.eval_interval=8", "train.eval_iters=1", "train.log_interval=100",
            "train.sample_tokens=4", "model.block_size=16", "train.batch_size=2", f"data.cache_dir={tmp}/cache",
            "train.threads=1", "train.snapshot_every=5"])
        trainer = Trainer(prepare_run(cfg), torch.device("cpu"), torch.float32)
        names = {3: "plain", 4: "snapshot", 7: "evaluation"}  # (0-based: the iteration that ends at step 5 is the 4th)
        calls = [0]

        # each iteration begins by setting its learning rate (schedule.set_rates; before 2026-12-06, Schedule.apply)
        rates = {("set_rates", str(Path("training", "schedule.py"))), ("apply", str(Path("training", "optim.py")))}

        def starts(frame):
            if any(frame.f_code.co_name == name and frame.f_code.co_filename.endswith(file) for name, file in rates):
                calls[0] += 1
                return names.get(calls[0] - 1, "")
            return None

        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
            seen = traced(root, trainer.fit, starts)
            prepared = prepare_run(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_iters=10)))
            resuming = {"resume", "check"}

            def resumes(frame):
                code = frame.f_code
                if code.co_name in resuming and "training" in code.co_filename:
                    return "resume"
                return None

            seen |= traced(root, lambda: Trainer(prepared, torch.device("cpu"), torch.float32), resumes)
    out = {}
    for name, pairs in seen.items():
        outside = {(f, n) for f, n in pairs if not f.startswith("model")}
        out[name] = (len({f for f, _ in pairs}), len(pairs), len({f for f, _ in outside}), len(outside))
    return out


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent).resolve()
    print("| folder | files | non-blank lines |\n|---|---|---|")
    for name in PACKAGES:
        files = sorted((root / name).glob("*.py"))
        if files:
            print(f"| `{name}/` | {len(files)} | {sum(map(lines, files)):,} |")
    newcomer = {p for name in NEWCOMER for p in ([root / name] if name.endswith(".py") else (root / name).glob("*.py"))}
    loop = root / "training" / "trainer.py"
    newcomer |= {p for p in closure(root, loop) if p.parent.name == "training"}
    print(f"\nthe newcomer's path (model/, data/, train.py, generate.py, the loop and the training/ modules it "
          f"imports): {len(newcomer)} files, {sum(map(lines, newcomer)):,} non-blank lines")
    print("\n| program | project files it imports | their non-blank lines | folders |\n|---|---|---|---|")
    closures = {program: closure(root, root / f"{program}.py") for program in PROGRAMS}
    closures["train.py and generate.py together"] = closures["train"] | closures["generate"]
    for program, files in closures.items():
        folders = sorted({p.parent.name for p in files if p.parent != root})
        name = f"`{program}.py`" if program in PROGRAMS else program
        print(f"| {name} | {len(files)} | {sum(map(lines, files)):,} | {', '.join(folders)} |")
    print("\n| program | project files a fresh interpreter loads on importing it | their non-blank lines |\n|---|---|---|")
    for program in PROGRAMS:
        files = loaded(root, program)
        print(f"| `{program}.py` | {len(files)} | {sum(map(lines, files)):,} |")
    attributes = trainer_attributes(root)
    print(f"\nTrainer's attributes: {len(attributes)} ({', '.join(attributes)})")
    print("\n| traced | project files | lines | files outside model/ | lines outside model/ |\n|---|---|---|---|---|")
    for name, figures in iteration_figures(root).items():
        print(f"| {name} | " + " | ".join(f"{x:,}" for x in figures) + " |")


if __name__ == "__main__":
    main()
