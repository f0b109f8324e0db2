"""The figures of docs/architecture.md, measured from the code with the standard library:
non-blank lines per folder, the newcomer's path, and the import closure of each program
(every project module it imports, directly or not, at any depth, lazy imports inside
functions included).

    python docs/layout_figures.py [ROOT]      # ROOT: a checkout (default: this one)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGES = ("model", "data", "common", "inspection", "interop", "training", "explorer")
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


if __name__ == "__main__":
    main()
