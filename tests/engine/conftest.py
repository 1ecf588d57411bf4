"""Shared engine-test fixtures: reference data and the shipped SmolLM2 GGUF (no Django)."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support import skip_or_fail

REPO_ROOT = Path(__file__).resolve().parents[2]


def _reference_dir() -> Path:
    """$PANTHEON_REFERENCE_DIR, else the copy of ../shared/reference kept in tests/reference."""
    env = os.environ.get("PANTHEON_REFERENCE_DIR")
    return Path(env) if env else REPO_ROOT / "tests" / "reference"


_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_DTYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?"}
_DTYPES |= {10: "<u8", 11: "<i8", 12: "<f8"}


def read_gguf_kv(path: Path) -> dict[str, Any]:
    """Only the key/value header of a GGUF, as plain values.

    gguf.GGUFReader takes ~2 s on a 49k-token vocabulary (a numpy view per string); this
    keeps the tests that only need metadata fast. One GGUFReader test covers the real path.
    """
    data = path.read_bytes()
    if data[:4] != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    pos = 24  # magic, u32 version, u64 n_tensors

    def take(fmt: str) -> Any:
        nonlocal pos
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    def string() -> str:
        nonlocal pos
        n = take("<Q")
        pos += n
        return data[pos - n : pos].decode("utf-8", errors="replace")

    def value(vtype: int) -> Any:
        nonlocal pos
        if vtype == 8:
            return string()
        if vtype == 9:
            itype, count = take("<I"), take("<Q")
            if itype in _DTYPES:
                arr = np.frombuffer(data, dtype=_DTYPES[itype], count=count, offset=pos)
                pos += arr.nbytes
                return arr.tolist()
            return [value(itype) for _ in range(count)]
        return take(_SCALARS[vtype])

    n_kv = struct.unpack_from("<Q", data, 16)[0]
    out = {}
    for _ in range(n_kv):
        key = string()
        out[key] = value(take("<I"))
    return out


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """Reference outputs from independent implementations (see tests/reference/README.md)."""
    path = _reference_dir()
    if not (path / "README.md").is_file():
        skip_or_fail(f"reference outputs not found at {path} (set PANTHEON_REFERENCE_DIR)")
    return path


@pytest.fixture(scope="session")
def smollm2_f32(reference_dir: Path) -> dict[str, Any]:
    """PyTorch float32 reference for SmolLM2 (tokenize[], greedy[])."""
    return json.loads((reference_dir / "smollm2-135m-instruct" / "f32.json").read_text("utf-8"))


@pytest.fixture(scope="session")
def smollm2_llamacpp(reference_dir: Path) -> dict[str, Any]:
    """llama.cpp reference for SmolLM2 (tokenize[], tokenize_special[], greedy[])."""
    path = reference_dir / "smollm2-135m-instruct" / "llamacpp.json"
    return json.loads(path.read_text("utf-8"))


@pytest.fixture(scope="session")
def smollm2_sha256(smollm2_path: Path) -> str:
    return hashlib.sha256(smollm2_path.read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def smollm2_metadata(smollm2_path: Path) -> dict[str, Any]:
    return read_gguf_kv(smollm2_path)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_metadata: dict[str, Any]):
    from engine.text.tokenizer import Tokenizer

    return Tokenizer.from_gguf(smollm2_metadata)


@pytest.fixture(scope="session")
def gguf_kv():
    """`read_gguf_kv` for tests: path -> plain metadata dict, without tensor parsing."""
    return read_gguf_kv


@pytest.fixture
def small_gguf(tmp_path: Path) -> Path:
    """A GGUF written with gguf.GGUFWriter: a 4-token gpt2 vocab and a chat template."""
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "small.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(["a", "b", "ab", "<|im_end|>"])
    w.add_token_types([1, 1, 1, 3])
    w.add_token_merges(["a b"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(3)
    w.add_add_bos_token(True)
    w.add_chat_template("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}")
    w.add_tensor("x", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="session")
def gemma3_f32(reference_dir: Path) -> dict[str, Any]:
    return json.loads((reference_dir / "gemma-3-270m" / "f32.json").read_text("utf-8"))


@pytest.fixture(scope="session")
def tiny_f32(reference_dir: Path) -> dict[str, Any]:
    return json.loads((reference_dir / "tiny" / "tiny_models_f32.json").read_text("utf-8"))


@pytest.fixture(scope="module")
def cpu():
    """The compiled CPU backend (kernels._cpu); skipped, or failed under
    PANTHEON_TESTS_STRICT, where it is not built."""
    from kernels import get_backend

    try:
        return get_backend("cpu")
    except ValueError as exc:
        skip_or_fail(str(exc))
