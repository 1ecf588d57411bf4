"""Loading errors are clear, and weights_version follows the file's bytes, not its name."""

from __future__ import annotations

import shutil

import gguf
import numpy as np
import pytest

from engine.loading.gguf_file import GGUFFile, ModelFileNotFound, NotAGGUFFile
from engine.serving.service import ModelService
from engine.types import ModelConfig, ModelLoadError


def write_gguf(path, arch="llama", value=1.0):
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_block_count(1)
    w.add_tensor("t", np.full((2, 3), value, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_missing_file_is_reported_as_not_found(tmp_path):
    with pytest.raises(ModelFileNotFound, match="not found"):
        GGUFFile(tmp_path / "nope.gguf")


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"this is not a model")
    with pytest.raises(NotAGGUFFile, match="not a GGUF"):
        GGUFFile(bad)


def test_a_truncated_gguf_is_refused_cleanly(tmp_path):
    good = write_gguf(tmp_path / "good.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[:40])
    with pytest.raises(NotAGGUFFile):
        GGUFFile(cut)


def test_an_unsupported_architecture_is_named_with_the_supported_list(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", arch="mamba9000")
    with pytest.raises(ModelLoadError, match=r"'mamba9000'.*supported: .*llama"):
        ModelService.load(ModelConfig(name="m", path=str(path)))


def test_metadata_and_tensors_are_read(tmp_path):
    gf = GGUFFile(write_gguf(tmp_path / "m.gguf", value=2.5))
    assert gf.architecture == "llama"
    assert gf.arch_value("block_count") == 1
    np.testing.assert_array_equal(gf.load_f32("t"), np.full((2, 3), 2.5, dtype=np.float32))


def test_weights_version_depends_on_content_not_path(tmp_path):
    a = write_gguf(tmp_path / "a.gguf", value=1.0)
    copy = tmp_path / "elsewhere" / "renamed.gguf"
    copy.parent.mkdir()
    shutil.copy(a, copy)
    other = write_gguf(tmp_path / "b.gguf", value=2.0)
    assert GGUFFile(a).weights_version == GGUFFile(copy).weights_version
    assert GGUFFile(a).weights_version != GGUFFile(other).weights_version


def test_quantised_tensors_dequantise_close_to_the_float_weights(tmp_path):
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((4, 64)).astype(np.float32)
    path = tmp_path / "q.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    q = gguf.quants.quantize(weights, gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("w", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    got = GGUFFile(path).load_f32("w")
    assert got.shape == (4, 64)
    np.testing.assert_allclose(got, weights, atol=0.02)
