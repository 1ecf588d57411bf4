"""The engine and the kernels stand alone: importing them loads no Django."""

from __future__ import annotations

import ast
import os
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
APPS = ("wire", "pantheon_platform", "pantheon_site", "operators", "sessions", "cluster", "access", "observability")


def test_outside_the_engine_nothing_imports_deeper_than_its_surface():
    import engine

    for package in APPS:
        for path in (REPO_ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            deep = {m for m in _imports(tree) if m.startswith("engine.")}
            assert not deep, f"{path.relative_to(REPO_ROOT)} imports {deep}: use `from engine import`"
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module == "engine":
                    missing = {a.name for a in node.names} - set(engine.__all__)
                    assert not missing, f"{path.relative_to(REPO_ROOT)}: engine has no {missing}"


def test_every_name_of_the_engines_surface_resolves():
    import engine

    for name in engine.__all__:
        assert getattr(engine, name) is not None, name
