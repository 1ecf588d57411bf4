"""The engine and the kernels stand alone: importing them loads no Django."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import sys
import engine.serving.service, engine.text.tokenizer, engine.types, kernels
leaked = sorted(m for m in sys.modules if m.split(".")[0] in {"django", "rest_framework", "channels", "daphne"})
print(",".join(leaked))
"""


def test_engine_and_kernels_import_without_django():
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        # No DJANGO_SETTINGS_MODULE: nothing may configure Django behind our back.
        env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"engine imports pull in: {result.stdout.strip()}"


# --- the kernel seam -------------------------------------------------------------------
ENGINE = REPO_ROOT / "engine"
MODELS = ENGINE / "models"
# What the engine may import from kernels/: the seam, never a particular backend.
# kernels.devices (threads: one pool size for BLAS and the kernels);
# kernels.devices.dies: where a model may be placed (dies, their engine threads, a split KV);
# kernels.devices.graphs: the CUDA-graph slots' bookkeeping (what the `graphs` object reports).
SEAM_MODULES = {
    "kernels",
    "kernels.backend",
    "kernels.weights",
    "kernels.devices",
    "kernels.devices.dies",
    "kernels.devices.graphs",
}
# What the shared block may still ask of numpy: index arrays, not weight math.
BLOCK_NUMPY = {"arange", "asarray", "int64", "ndarray"}


def _imports(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_the_engine_reaches_kernels_only_through_the_seam():
    for path in ENGINE.rglob("*.py"):
        used = {m for m in _imports(ast.parse(path.read_text())) if m.split(".")[0] == "kernels"}
        assert used <= SEAM_MODULES, f"{path.relative_to(REPO_ROOT)} imports {used - SEAM_MODULES}"


def test_no_model_file_does_weight_math():
    for path in MODELS.glob("*.py"):
        tree = ast.parse(path.read_text())
        where = path.relative_to(REPO_ROOT)
        assert not any(isinstance(n, ast.MatMult) for n in ast.walk(tree)), f"{where} uses @"
        numpy_attrs = {
            n.attr
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "np"
        }
        assert numpy_attrs <= BLOCK_NUMPY, f"{where} calls numpy's {numpy_attrs - BLOCK_NUMPY}"
        if not path.name.startswith("_"):  # an architecture only declares: spec + load
            assert _imports(tree) <= {"__future__"}, f"{where} imports {_imports(tree)}"


# --- the import contracts (pyproject.toml [tool.importlinter], run by `make test`) ------
def _importlinter() -> dict:
    import tomllib

    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def test_every_top_level_package_is_under_the_contracts():
    packages = {
        p.name
        for p in REPO_ROOT.iterdir()
        if (p / "__init__.py").exists() and p.name not in {"tests", "bench", "build", "scripts"}
    }
    assert packages <= set(_importlinter()["root_packages"])


def test_the_contracts_name_packages_not_modules():
    """A contract that lists modules has to be edited for every new file; one that names
    packages covers them. Only the admin contract names modules (the views it forbids)."""
    for contract in _importlinter()["contracts"]:
        if contract["id"] == "admin":
            continue
        named = [
            n for key in ("layers", "source_modules", "modules") for n in contract.get(key, [])
        ]
        for entry in named:
            for name in entry.replace("|", ":").split(":"):
                assert "." not in name.strip(), (contract["id"], name)


# --- the engine's public surface (engine/__init__.py) ------------------------------------
APPS = (
    "wire",
    "pantheon_platform",
    "pantheon_site",
    "operators",
    "sessions",
    "cluster",
    "access",
    "observability",
)


def test_outside_the_engine_nothing_imports_deeper_than_its_surface():
    import engine

    for package in APPS:
        for path in (REPO_ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            deep = {m for m in _imports(tree) if m.startswith("engine.")}
            assert not deep, (
                f"{path.relative_to(REPO_ROOT)} imports {deep}: use `from engine import`"
            )
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module == "engine":
                    missing = {a.name for a in node.names} - set(engine.__all__)
                    assert not missing, f"{path.relative_to(REPO_ROOT)}: engine has no {missing}"


def test_every_name_of_the_engines_surface_resolves():
    import engine

    for name in engine.__all__:
        assert getattr(engine, name) is not None, name


# --- the house's shape: small modules, no import circle ---------------------------------
PRODUCTION = [
    "pantheon_site",
    "pantheon_platform",
    "engine",
    "wire",
    "kernels",
    "operators",
    "sessions",
    "access",
    "cluster",
    "observability",
]
FILE_LINES_MAX = 600  # DESIGN.md: a file past ~500 lines usually holds two ideas
CLASS_LINES_MAX = 400


def _production_files() -> list[Path]:
    return sorted(
        path
        for package in PRODUCTION
        for path in (REPO_ROOT / package).rglob("*.py")
        if "migrations" not in path.parts
    )


def test_no_production_file_or_class_outgrows_the_size_rule():
    too_big = []
    for path in _production_files():
        text = path.read_text()
        rel = path.relative_to(REPO_ROOT).as_posix()
        if (lines := text.count("\n")) > FILE_LINES_MAX:
            too_big.append(f"{rel}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                size = node.end_lineno - node.lineno + 1
                if size > CLASS_LINES_MAX:
                    too_big.append(f"{rel}:{node.name}: class of {size} lines")
    assert not too_big, "split these (files ≤ 600 lines, classes ≤ 400):\n" + "\n".join(too_big)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported_modules(tree: ast.Module, module: str, is_package: bool, known: set[str]) -> set[str]:
    """Every module a module imports, at load time or lazily inside a function (a lazy
    import is still an edge of the drawing), but not under `if TYPE_CHECKING:`; relative
    imports resolved; `from a import b` is an edge to the module a.b where there is one
    (known: the modules, compiled ones too), else to a."""
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
        for inner in ast.walk(node)
    }
    base = module.split(".") if is_package else module.split(".")[:-1]
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                root = base[: len(base) - node.level + 1]
                target = ".".join(root + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                names.add(submodule if submodule in known else target)
    return names


def test_no_import_circle_between_production_modules():
    modules = {_module_name(path): path for path in _production_files()}
    # The compiled modules setup.py builds (there whether or not this machine built them).
    compiled = set(re.findall(r'Extension\(\s*"([\w.]+)"', (REPO_ROOT / "setup.py").read_text()))
    known = set(modules) | compiled
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        imported = _imported_modules(
            ast.parse(path.read_text()), name, path.name == "__init__.py", known
        )
        graph[name] = {other for other in imported if other in modules and other != name}
    # Tarjan's strongly connected components: a component of two or more is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def strongconnect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                strongconnect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(graph):
        if node not in index:
            strongconnect(node)
    assert not circles, (
        "modules importing each other (a circle in the import graph):\n"
        + "\n".join(" <-> ".join(circle) for circle in circles)
    )
