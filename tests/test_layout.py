"""The layers: model/ and data/ at the bottom, common/ above them, inspection/ (what shows
the model) above that, training/, explorer/ and the programs on top; generate.py needs
nothing of training/; no import cycles; nothing POSIX-only at import time; the shape
trace observes the model, it never replaces its functions; each function fits on a screen,
the Trainer only trains, and a public name means one thing."""

import ast
import collections
import subprocess
import sys

from conftest import ROOT

PACKAGES = ("model", "data", "common", "inspection", "training", "explorer", "bench")
PROGRAMS = ("train", "generate", "evaluate", "export", "explore")
# what each part of the project may import from the project
ALLOWED = {
    "model": {"model"},
    "data": {"data"},
    "common": {"common", "model", "data"},
    "inspection": {"inspection", "common", "model", "data"},  # what shows the model: below its users
    "training": {"training", "inspection", "common", "model", "data"},
    "explorer": {"explorer", "inspection", "common", "model", "data"},
    "bench": {*PACKAGES, *PROGRAMS},  # it measures the whole project, so it may use anything
    "generate": {"inspection", "common", "model", "data", "explorer"},
    "evaluate": {"common", "model", "data", "training"},
    "export": {"common", "model", "data", "training"},
    "train": {"inspection", "common", "model", "data", "training"},
    "explore": {"inspection", "common", "model", "data", "explorer"},
}


def project_imports(path) -> set[str]:
    """The project modules a file imports ('model.gpt', 'common.cli', ...), relative imports resolved."""
    package = path.parent.name if path.parent != ROOT else None
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = f"{package}.{node.module}" if node.level and node.module else (package if node.level else node.module)
            if not (node.level and node.module is None):  # "from . import x" imports only x
                found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in found if name.split(".")[0] in (*PACKAGES, *PROGRAMS)}


def modules():
    """{module name: path} for every non-test Python file."""
    files = {p.stem: p for p in (ROOT / f"{name}.py" for name in PROGRAMS) if p.exists()}
    for package in PACKAGES:
        for path in (ROOT / package).glob("*.py"):
            files[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return files


def test_each_layer_imports_only_what_is_below_it():
    for name, path in modules().items():
        for imported in project_imports(path):
            assert imported.split(".")[0] in ALLOWED[name.split(".")[0]], f"{name} imports {imported}"


def test_no_import_cycles():
    files = modules()
    graph = {name: {m for m in project_imports(path) if m in files and m != name} for name, path in files.items()}
    state = {}

    def visit(name, trail):
        if state.get(name) == "done":
            return
        assert state.get(name) != "open", " -> ".join([*trail, name])
        state[name] = "open"
        for nxt in graph[name]:
            visit(nxt, [*trail, name])
        state[name] = "done"

    for name in graph:
        visit(name, [])


def test_programs_import_without_posix_only_modules():
    """As on Windows: fcntl (and its like) cannot be imported."""
    code = ("import sys\nfor name in ('fcntl', 'termios', 'resource', 'pwd', 'grp'): sys.modules[name] = None\n"
            "import train, generate, explore, training.trainer, explorer.server")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_tools_that_show_the_model_only_observe_it():
    """inspection/ reads what the model hands back and what forward hooks see: it neither
    reaches into model.attention nor swaps a function of the model for its own."""
    for path in (ROOT / "inspection").glob("*.py"):
        source = path.read_text(encoding="utf-8")
        assert "model.attention" not in source and "setattr(" not in source, path


def test_each_function_fits_on_a_screen():
    """No function outside the tests is longer than 50 lines (docstring included)."""
    paths = [*modules().values(), *(ROOT / "docs").glob("*.py")]
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                assert length <= 50, f"{path.relative_to(ROOT)}:{node.lineno} {node.name} is {length} lines"


def test_the_trainer_only_trains():
    """The loop's file stays small: the budget, resume, the average and the setup live beside it."""
    lines = (ROOT / "training" / "trainer.py").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, len(lines)


def test_a_public_name_means_one_thing():
    """No two modules define the same public function or class (the programs' entry points,
    main, parse_args and run, excepted: each program has its own)."""
    defined = collections.defaultdict(list)
    for name, path in modules().items():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                defined[node.name].append(name)
    twice = {n: where for n, where in defined.items() if len(where) > 1 and n not in ("main", "parse_args", "run")}
    assert not twice, twice
