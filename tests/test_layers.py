"""The package's layers, enforced from its imports (every import, lazy ones inside functions included).

``octo_dist/`` reads bottom-up: the pinned stack, the cluster (launchers, job scripts), the process runtime, the
engine, the policies, the environment checks, then the applications and the CLI on top. A layer may import
itself and the layers listed for it below, nothing else: nothing runs back up, models never see an application,
and the host-side layers (which run on a login node's bare Python) never pull in jax, numpy or mpi4py.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO

PACKAGE = "octo_dist"
# layer -> the other layers it may import (it may always import itself and the top-level octo_dist/__init__).
ALLOWED = {
    "stack": set(),
    "launchers": set(),
    "jobs": {"launchers"},
    "runtime": {"launchers", "stack"},
    "engine": {"runtime"},
    "policies": {"engine", "runtime"},
    "envcheck": {"stack", "launchers", "runtime"},
    "apps": {"policies", "engine", "runtime", "launchers", "stack", "envcheck", "jobs"},
}
# Third-party modules a layer must never import: the host-side layers run on a bare Python (ABCI's login nodes,
# `octo-dist launch`), and the engine must not know Octo exists (policies/ adapts it).
FORBIDDEN = {
    "stack": {"jax", "jaxlib", "numpy", "mpi4py", "flax", "optax", "octo"},
    "launchers": {"jax", "jaxlib", "numpy", "mpi4py", "flax", "optax", "octo"},
    "jobs": {"jax", "jaxlib", "numpy", "mpi4py", "flax", "optax", "octo"},
    "engine": {"octo"},
}


def imported_modules(source: str, module: str) -> list[str]:
    """Every module a file imports, with relative imports made absolute (``module`` is the file's dotted name)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")[: -node.level]
                base = ".".join(parts + ([base] if base else []))
            # `from octo_dist.engine import train` imports octo_dist.engine.train: count the names as submodules too.
            out += [base] + [f"{base}.{a.name}" for a in node.names if base.startswith(PACKAGE)]
    return out


# Top-level modules every layer may import: the one problem type (standard library only).
SHARED = {"problems"}


def layer_of(dotted: str) -> str | None:
    """``"octo_dist.engine.train"`` -> ``"engine"``; top-level modules (cli, __main__) and outsiders -> None."""
    parts = dotted.split(".")
    if len(parts) >= 2 and parts[0] == PACKAGE and parts[1] in SHARED:
        return None
    return (
        parts[1]
        if parts[0] == PACKAGE and len(parts) > 2 or (len(parts) == 2 and parts[1] in ALLOWED)
        else None
    )


def violations(package_dir: Path) -> list[str]:
    """One line per import that breaks the layer rules, for the package rooted at ``package_dir``."""
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir.parent).with_suffix("")
        module = ".".join(rel.parts)
        layer = layer_of(module)
        if layer is None:
            continue
        seen = (
            set()
        )  # `from octo_dist.x import a, b` names x, x.a and x.b: one finding per file and layer
        for imported in imported_modules(path.read_text(), module):
            top = imported.split(".")[0]
            if top in FORBIDDEN.get(layer, ()) and top not in seen:
                seen.add(top)
                found.append(f"{rel}.py imports {imported}: {layer}/ must not import {top}")
            target = layer_of(imported) if top == PACKAGE else None
            if target and target != layer and target not in ALLOWED[layer] and target not in seen:
                seen.add(target)
                found.append(
                    f"{rel}.py imports {imported}: {layer}/ may import only {sorted(ALLOWED[layer]) or 'itself'}"
                )
    return found


def test_the_package_has_one_directory_per_layer():
    dirs = {p.name for p in (REPO / PACKAGE).iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert dirs == set(ALLOWED)
    loose = {p.name for p in (REPO / PACKAGE).glob("*.py")}
    # problems.py: the one problem type every layer raises; savelayout.py: the names in a save directory, which the
    # job runtime and the engine both write; subcommand.py: how each layer's `octo-dist COMMAND` parser is made
    # (standard library only, so any layer may import them).
    assert loose == {
        "__init__.py",
        "__main__.py",
        "cli.py",
        "problems.py",
        "savelayout.py",
        "subcommand.py",
    }


def test_no_import_breaks_a_layer_rule():
    assert violations(REPO / PACKAGE) == []


@pytest.mark.parametrize(
    "layer, line, expected",
    [
        ("engine", "from octo_dist.apps.smoke import app\n", "engine/ may import only ['runtime']"),
        (
            "runtime",
            "def f():\n    from octo_dist.engine import train\n",
            "runtime/ may import only ['launchers', 'stack']",
        ),
        ("stack", "def f():\n    import jax\n", "stack/ must not import jax"),
        ("launchers", "from mpi4py import MPI\n", "launchers/ must not import mpi4py"),
        ("engine", "import octo.model\n", "engine/ must not import octo"),
        (
            "policies",
            "from ..apps.finetune import config\n",
            "policies/ may import only ['engine', 'runtime']",
        ),
    ],
)
def test_a_fabricated_back_import_is_reported(tmp_path, layer, line, expected):
    copy = tmp_path / PACKAGE
    shutil.copytree(REPO / PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / layer / "bad.py").write_text(line)
    found = violations(copy)
    assert (
        len(found) == 1
        and found[0].startswith(f"{PACKAGE}/{layer}/bad.py imports")
        and expected in found[0]
    )


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_ruff_finds_nothing(command):
    """Lint (pyflakes' rules and pycodestyle's errors) and formatting, on every Python file in the checkout.

    The rules and the line length live in pyproject.toml's [tool.ruff]; `ruff format` fixes what the second fails.
    """
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent))
    if ruff is None:
        pytest.skip("ruff is in the dev lock: make dev-env")
    proc = subprocess.run([ruff, *command, "."], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- function length ---------------------------------------------------------------------------------------------

# A function longer than this is split into named steps: a reader follows each step on one screen.
MAX_FUNCTION_LINES = 60


def long_functions(package_dir: Path, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """``{"octo_dist/engine/train.py:fit": 159, "octo_dist/x.py:Class.method": 130}``: every function or method
    of the package over ``limit`` lines (its decorators and docstring included)."""
    found = {}

    def visit(node: ast.AST, where: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                    lines = child.end_lineno - first + 1
                    if lines > limit:
                        found[f"{where}:{name}"] = lines
                visit(child, where, name + ".")
            else:
                visit(child, where, prefix)

    for path in sorted(package_dir.rglob("*.py")):
        visit(ast.parse(path.read_text()), path.relative_to(package_dir.parent).as_posix(), "")
    return found


def test_no_function_is_longer_than_the_limit():
    found = {name: lines for name, lines in long_functions(REPO / PACKAGE).items()}
    assert found == {}, (
        f"over {MAX_FUNCTION_LINES} lines, split them into named steps: "
        + ", ".join(f"{name} ({lines} lines)" for name, lines in sorted(found.items()))
    )


def test_a_fabricated_long_function_is_reported(tmp_path):
    package = tmp_path / PACKAGE
    (package / "engine").mkdir(parents=True)
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (package / "engine" / "long.py").write_text(
        f"def just_fits():\n{body[: body.rindex('    x')]}\n"  # the def line and all but one of body: the limit
        f"class Loop:\n    @staticmethod\n    def step():\n{body.replace('    x', '        x')}"
        f"\n\ndef too_long():\n{body}"
    )
    assert long_functions(package) == {
        f"{PACKAGE}/engine/long.py:Loop.step": MAX_FUNCTION_LINES + 2,
        f"{PACKAGE}/engine/long.py:too_long": MAX_FUNCTION_LINES + 1,
    }


# --- module length -----------------------------------------------------------------------------------------------

# A module longer than this holds more than one concern: split it, one file per concern (no utils.py).
MAX_MODULE_LINES = 500


def long_modules(package_dir: Path, limit: int = MAX_MODULE_LINES) -> dict[str, int]:
    """``{"octo_dist/jobs/spec.py": 910}``: every module of the package over ``limit`` lines."""
    found = {}
    for path in sorted(package_dir.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > limit:
            found[path.relative_to(package_dir.parent).as_posix()] = lines
    return found


def test_no_module_is_longer_than_500_lines():
    found = long_modules(REPO / PACKAGE)
    assert found == {}, f"over {MAX_MODULE_LINES} lines, split them by concern: " + ", ".join(
        f"{name} ({lines} lines)" for name, lines in sorted(found.items())
    )


def test_a_fabricated_long_module_is_reported(tmp_path):
    package = tmp_path / PACKAGE
    (package / "jobs").mkdir(parents=True)
    (package / "jobs" / "fits.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    (package / "jobs" / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert long_modules(package) == {f"{PACKAGE}/jobs/long.py": MAX_MODULE_LINES + 1}


# ---- no import cycle: what runs when a module is imported (module-level imports; lazy ones inside functions are
# how a module defers a heavy or optional import, and run after every module involved has loaded) ------------------


def module_graph(package_dir: Path, lazy: bool = False) -> dict:
    """``{"octo_dist.jobs.cli": {"octo_dist.jobs.spec", ...}}``: each module and the package modules its
    module-level imports load (``from x import name`` counts ``x.name`` when that is a module); ``lazy``: the imports
    inside its functions too."""
    root = package_dir.parent
    mods = {
        ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
        for p in package_dir.rglob("*.py")
    }
    graph = {}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        edges = set()
        tree = ast.parse(path.read_text())
        # module level: what runs when it is imported; lazy: every import the module names
        for node in ast.walk(tree) if lazy else tree.body:
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = mod.split(".")[
                        : len(mod.split(".")) - node.level + (1 if is_pkg else 0)
                    ]
                    base = ".".join(parts + ([base] if base else []))
                names = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names
                ]
            for n in names:
                while n and n not in mods:
                    n = n.rpartition(".")[0]
                if n and n != mod:
                    edges.add(n)
        graph[mod] = edges
    return graph


def cycles(graph: dict) -> list:
    """The import cycles of ``graph`` (Tarjan's strongly connected components of more than one module)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_module_level_import_cycle():
    graph = module_graph(REPO / PACKAGE)
    assert len(graph) > 100 and not cycles(graph), cycles(graph)


def test_no_import_cycle_through_a_function_level_import_either():
    """A lazy import defers a load; two modules that need each other are still one concern split in two (the
    render's warnings and --submit's refusals were, until their shared values got a module of their own)."""
    graph = module_graph(REPO / PACKAGE, lazy=True)
    assert len(graph) > 100 and not cycles(graph), cycles(graph)


def test_a_fabricated_import_cycle_is_reported(tmp_path):
    pkg = tmp_path / PACKAGE / "jobs"
    pkg.mkdir(parents=True)
    (tmp_path / PACKAGE / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from octo_dist.jobs import b\n")
    (pkg / "b.py").write_text("from . import c\n")
    (pkg / "c.py").write_text(
        "import octo_dist.jobs.a\n\n\ndef later():\n    from octo_dist.jobs import b\n"
    )
    assert cycles(module_graph(tmp_path / PACKAGE)) == [
        ["octo_dist.jobs.a", "octo_dist.jobs.b", "octo_dist.jobs.c"]
    ]
    (pkg / "c.py").write_text(
        "def later():\n    import octo_dist.jobs.a\n"
    )  # lazy: no cycle at import time
    assert cycles(module_graph(tmp_path / PACKAGE)) == []
    assert cycles(module_graph(tmp_path / PACKAGE, lazy=True)) == [
        ["octo_dist.jobs.a", "octo_dist.jobs.b", "octo_dist.jobs.c"]
    ]


# ---- a run's files have one name-giver: savelayout.py builds every path to them ---------------------------------

# The calls that build a path from parts ("/" between paths counts too).
PATH_BUILDERS = {"join", "joinpath", "with_name", "Path", "PurePath"}


def run_file_names(savelayout_source: str) -> dict:
    """savelayout's names of a run's files: its module-level text constants that are not variables' names or prose
    (``*_ENV``, ``*_SAYS``): ``{"SUMMARY": "summary.json", "JOB_DIR_PREFIX": ".octo-dist-job-", ...}``."""
    names = {}
    for node in ast.parse(savelayout_source).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if (
                    isinstance(target, ast.Name)
                    and target.id.isupper()
                    and isinstance(node.value.value, str)
                    and not target.id.endswith(("_ENV", "_SAYS"))
                ):
                    names[target.id] = node.value.value
    return names


def _names_a_run_file(node: ast.AST, names: dict, aliases: set) -> bool:
    """``savelayout.SUMMARY``, a module's own alias of one (``RECORD = savelayout.JOBS_RECORD``), or text that is
    one or starts with one (``"summary.json"``, ``f".octo-dist-probe.{host}"``)."""
    if isinstance(node, ast.Attribute) and node.attr in names:
        return isinstance(node.value, ast.Name) and node.value.id == "savelayout"
    if isinstance(node, ast.Name):
        return node.id in aliases
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[
            0
        ]  # f"{LOCK_NAME}.stale.{host}" starts with a name; f".octo-dist-probe.{h}" with text
        node = first.value if isinstance(first, ast.FormattedValue) else first
        return _names_a_run_file(node, names, aliases)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return any(
            node.value == v or (v.startswith(".") and node.value.startswith(v))
            for v in names.values()
        )
    return False


def run_file_paths(package_dir: Path) -> list:
    """``"octo_dist/jobs/x.py:12"`` for each place outside savelayout.py that builds a path from a run's file name
    (``os.path.join(save_dir, savelayout.JOBS_RECORD)``, ``directory / ".octo-dist-probe.h.1"``)."""
    names = run_file_names((package_dir / "savelayout.py").read_text())
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        if path.name == "savelayout.py" and path.parent == package_dir:
            continue
        tree = ast.parse(path.read_text())
        aliases = {
            t.id
            for node in tree.body
            if isinstance(node, ast.Assign) and _names_a_run_file(node.value, names, set())
            for t in node.targets
            if isinstance(t, ast.Name)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                parts = node.args if called in PATH_BUILDERS else []
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                parts = [node.left, node.right]
            else:
                continue
            if any(_names_a_run_file(p, names, aliases) for p in parts):
                found.append(f"{path.relative_to(package_dir.parent)}:{node.lineno}")
    return found


def test_only_savelayout_builds_the_paths_of_a_runs_files():
    """Principle 18: a run's files (the jobs' record, a job's directory and notes, checkpoints, the summary, the
    lock) are named and joined in octo_dist/savelayout.py; every other module asks it (``savelayout.node_list``)."""
    assert run_file_paths(REPO / PACKAGE) == []


def test_a_fabricated_run_file_path_is_reported(tmp_path):
    package = tmp_path / PACKAGE
    (package / "jobs").mkdir(parents=True)
    (package / "savelayout.py").write_text('NODE_LIST = "nodes"\nJOB_ID_ENV = "OCTO_DIST_JOB_ID"\n')
    (package / "jobs" / "ok.py").write_text(
        "import os\nfrom octo_dist import savelayout\n\n\ndef f(d):\n    return savelayout.node_list(d), "
        "os.path.join(d, os.environ[savelayout.JOB_ID_ENV])\n"
    )
    (package / "jobs" / "joins.py").write_text(
        "import os\nfrom pathlib import Path\nfrom octo_dist import savelayout\nLIST = savelayout.NODE_LIST\n\n\n"
        "def f(d):\n"
        "    a = os.path.join(d, savelayout.NODE_LIST)\n"
        "    b = Path(d) / LIST\n"
        '    return a, b, Path(d).joinpath(f"nodes")\n'
    )
    assert run_file_paths(package) == [
        f"{PACKAGE}/jobs/joins.py:8",
        f"{PACKAGE}/jobs/joins.py:9",
        f"{PACKAGE}/jobs/joins.py:10",
    ]
