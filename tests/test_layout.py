"""The layers, as docs/architecture.md's table says them (read from the page): each file
imports only what its part may, and each program loads (measured in a fresh interpreter)
only what its row says, nothing it must never; generate.py loads no reader of files or
datasets; no import cycles; nothing POSIX-only at import time; the tools that show the model
observe it, they never replace its functions; no module but the run folder's owner names a
file of the run folder; a public name means one thing. (That no program asks which kind of
job it holds is tests/test_jobs.py's: a kind made there is one class every program asks.)"""

import ast
import collections
import re
import subprocess
import sys

import pytest

from conftest import ROOT

PACKAGES = ("storage", "cli", "machine", "model", "data", "runs", "lora", "jobs", "inspection", "interop", "training",
            "explorer", "bench")
PROGRAMS = ("train", "generate", "evaluate", "export", "explore")


def architecture() -> dict[str, tuple[set[str], set[str]]]:
    """docs/architecture.md's table of the layers: {part: (what it may import, what it must never
    import)}, each part named as a module is (`data`, `train`); a part may import itself."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = text[text.index("| part | may import | never |"):].split("\n\n")[0].splitlines()[2:]

    def named(cell: str) -> set[str]:
        return set(re.findall(r"`(\w+)(?:/|\.py)`", cell))

    rows = {}
    for line in table:
        part, may, never = (cell.strip() for cell in line.strip("|").split("|"))
        for name in named(part):
            rows[name] = (named(may) | {name}, named(never))
    return rows


ALLOWED = {part: may for part, (may, _) in architecture().items()} | {"bench": {*PACKAGES, *PROGRAMS}}


def project_imports(path) -> set[str]:
    """The project modules a file imports ('model.gpt', 'cli.program', ...), relative imports resolved."""
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


def test_the_table_names_every_part_of_the_project():
    assert set(ALLOWED) == {*PACKAGES, *PROGRAMS}


@pytest.mark.parametrize("program", PROGRAMS)
def test_what_a_program_loads_is_what_the_architecture_page_says(program):
    """Measured, not read: the project's packages a fresh interpreter holds once the program is
    imported are among those the page says it may import, and none of those it must never."""
    code = f"import sys, {program}\nprint(' '.join(sorted({{name.split('.')[0] for name in sys.modules}})))"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = set(result.stdout.split()) & {*PACKAGES, *PROGRAMS}
    may, never = architecture()[program]
    assert loaded <= may and not loaded & never, (loaded - may, loaded & never)


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
    """inspection/ and explorer/ read what the model hands back (model.trace) and what
    forward hooks see: they neither import the attention module's insides nor replace a
    function or attribute of the model's modules with their own."""
    for path in [*(ROOT / "inspection").glob("*.py"), *(ROOT / "explorer").glob("*.py")]:
        assert "model.attention" not in project_imports(path), path
        tree = ast.parse(path.read_text(encoding="utf-8"))
        from_model = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                      and (node.module or "").split(".")[0] == "model" for alias in node.names}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id != "setattr", f"{path}:{node.lineno} calls setattr"
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                while isinstance(target, ast.Attribute):
                    target = target.value
                assert not (isinstance(target, ast.Name) and target.id in from_model), \
                    f"{path}:{node.lineno} assigns to {target.id}, which comes from model/"


def test_only_the_run_folders_owner_names_its_files():
    """Every program opens a run through runs/folder.py's RunDir; the model's two files
    are GPT.save_pretrained's (model/gpt.py)."""
    names = ("trainer_state.pt", "summary.json", "config.yaml", "snapshots/")
    owners = {ROOT / "runs" / "folder.py"}
    for path in modules().values():
        if path in owners or path.parent.name == "bench":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
        strings = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                   and isinstance(node.value, str) and id(node) not in docstrings]
        for name in names:
            assert not any(name in text for text in strings), f"{path.relative_to(ROOT)} names {name}"


def test_a_public_name_means_one_thing():
    """No two modules define the same public function or class (the programs' entry points,
    main, parse_args and command, excepted: each program has its own)."""
    defined = collections.defaultdict(list)
    for name, path in modules().items():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                defined[node.name].append(name)
    twice = {n: where for n, where in defined.items() if len(where) > 1 and n not in ("main", "parse_args", "command")}
    assert not twice, twice


def test_generating_imports_no_data_preparation():
    """generate.py (and --chat) needs the tokenizer, the chat template and the reading of tool
    calls, never the readers of files and datasets, the token cache or the batches: importing
    it loads none of them, nor datasets or pyarrow."""
    code = ("import sys, generate\n"
            "print(' '.join(sorted(name for name in sys.modules if name.split('.')[0] in ('data', 'datasets', "
            "'pyarrow', 'training', 'explorer'))))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = set(result.stdout.split())
    assert loaded == {"data", "data.config", "data.shared", "data.template", "data.tokenizer", "data.tool_calls"}, loaded


def test_the_model_loads_without_torchs_compiler():
    """Importing the model loads no torch._dynamo (a decorator of torch.compiler's at import
    would: 9 s more to start every program, and a DDP worker that hung at its exit)."""
    code = "import sys, model, generate\nprint('torch._dynamo' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stdout + result.stderr[-2000:]


def test_a_chat_template_is_made_in_one_place():
    """Every chat template a program renders is made by data/template.py's template_for (with
    the tokenizer's special tokens): no other module calls ChatTemplate itself."""
    for name, path in modules().items():
        if name == "data.template":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "ChatTemplate":
                raise AssertionError(f"{name}:{node.lineno} makes a ChatTemplate; call data.template.template_for")
