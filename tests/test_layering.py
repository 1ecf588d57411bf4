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
import inference.engine.serving.service, inference.engine.text.tokenizer, inference.engine.types, kernels
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
ENGINE = REPO_ROOT / "inference"
MODELS = ENGINE / "engine" / "models"
# What the engine may import from kernels/: the seam, never a particular backend.
# kernels.dies: where a model may be placed (dies, their engine threads, a split KV);
# kernels.graphs: the CUDA-graph slots' bookkeeping (what the `graphs` object reports).
SEAM_MODULES = {"kernels", "kernels.backend", "kernels.weights", "kernels.dies", "kernels.graphs"}
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


def _inference_parts() -> set[str]:
    """inference's app: every module and package of inference/ but its engine."""
    return {
        f"inference.{p.stem}"
        for p in ENGINE.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
    } - {"inference.engine"}


def test_the_contracts_name_every_part_of_the_inference_app():
    """inference/ is an app with the engine inside it, so the contracts list its parts;
    a new module must be placed in a layer, or import-linter would not check it."""
    config = _importlinter()
    contracts = {c["id"]: c for c in config["contracts"]}
    app_layer = contracts["layers"]["layers"][1]
    listed = {name.strip().strip("()") for name in app_layer.replace("\n", " ").split(":")}
    assert _inference_parts() <= listed, _inference_parts() - listed
    shims = {n for n in listed if n.startswith("inference.")} - _inference_parts()
    assert not shims, f"listed but gone: {shims}"
    # The shims at the old paths are the only parts the forbidden contracts may skip.
    optional = {n.strip()[1:-1] for n in app_layer.replace("\n", " ").split(":") if "(" in n}
    for contract in ("apps-to-inference", "inference-to-apps"):
        c = contracts[contract]
        named = set(c.get("forbidden_modules", [])) | set(c.get("source_modules", []))
        assert _inference_parts() - optional <= named, (contract, _inference_parts() - named)


def test_every_top_level_package_is_under_the_contracts():
    packages = {
        p.name
        for p in REPO_ROOT.iterdir()
        if (p / "__init__.py").exists() and p.name not in {"tests", "bench", "build"}
    }
    assert packages <= set(_importlinter()["root_packages"])
