"""The one-pass GGUF header reader reads what gguf-py's GGUFReader reads, and refuses
malformed bytes with HeaderError (never an IndexError, a hang or a huge allocation)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from gguf import GGUFReader

from engine.loading.gguf_file import GGUFFile, NotAGGUFFile
from engine.loading.gguf_header import HeaderError, read_header
from tests.tiny_gguf import write_tiny_llama


def _reference(path):
    reader = GGUFReader(path)
    metadata = {}
    for key, field in reader.fields.items():
        if not key.startswith("GGUF."):
            metadata[key] = field.contents()
    return metadata, reader.tensors


def test_the_shipped_model_reads_as_gguf_py_reads_it(smollm2_path):
    metadata, tensors = read_header(np.memmap(smollm2_path, np.uint8, mode="r"))
    ref_metadata, ref_tensors = _reference(smollm2_path)
    assert metadata == ref_metadata  # the 49k-token vocabulary, merges, scalars, template
    assert len(tensors) == len(ref_tensors)
    for t in ref_tensors:
        entry = tensors[t.name]
        assert (entry.tensor_type, list(entry.shape)) == (t.tensor_type, t.shape.tolist())
        assert (entry.offset, entry.nbytes) == (t.data_offset, t.n_bytes)


def test_a_written_file_round_trips(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf")
    metadata, tensors = read_header(path.read_bytes())
    assert metadata == _reference(path)[0]
    reader = GGUFReader(path)
    gf = GGUFFile(path)
    assert set(tensors) == set(gf.tensors) == {t.name for t in reader.tensors}
    for t in reader.tensors:  # the bytes at each offset are the tensor's
        ours = gf.load_f32(t.name).reshape(-1)
        np.testing.assert_array_equal(ours, np.asarray(t.data, dtype=np.float32).reshape(-1))


@pytest.mark.parametrize("cut", [3, 10, 30, 200, -1])
def test_a_truncated_file_is_refused(tmp_path, cut):
    data = write_tiny_llama(tmp_path / "m.gguf").read_bytes()
    with pytest.raises(HeaderError):
        read_header(data[:cut] if cut > 0 else data[: len(data) - 64])


def test_impossible_counts_and_versions_are_refused():
    base = b"GGUF" + struct.pack("<I", 3)
    with pytest.raises(HeaderError, match="version"):
        read_header(b"GGUF" + struct.pack("<IQQ", 9, 0, 0))
    with pytest.raises(HeaderError, match="counts"):
        read_header(base + struct.pack("<QQ", 2**60, 0))
    array_of_strings = struct.pack("<Q", 1) + b"k" + struct.pack("<IIQ", 9, 8, 2**40)
    with pytest.raises(HeaderError):
        read_header(base + struct.pack("<QQ", 0, 1) + array_of_strings)


def test_a_damaged_file_is_not_a_gguf_file_at_open(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf")
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(NotAGGUFFile):
        GGUFFile(path)


def test_a_string_array_with_a_bad_element_leaves_its_key_out_and_reads_on():
    def s(b: bytes) -> bytes:
        return struct.pack("<Q", len(b)) + b

    pieces = [b"x", b"\xff\xfe", b"yz"]  # the second is not UTF-8
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 3)
    data += s(b"t.ok") + struct.pack("<IIQ", 9, 8, 2) + s(b"a") + s(b"bc")
    data += s(b"t.bad") + struct.pack("<IIQ", 9, 8, 3) + b"".join(s(p) for p in pieces)
    data += s(b"t.after") + struct.pack("<II", 4, 7)
    metadata, tensors = read_header(data)
    assert metadata == {"t.ok": ["a", "bc"], "t.after": 7} and tensors == {}
    with pytest.raises(HeaderError):  # an element's length past the end
        read_header(data[: data.index(b"yz") + 1])
