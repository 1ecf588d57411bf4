"""`pantheon serve`'s flags as the PANTHEON_* variables the settings read (no server)."""

from __future__ import annotations

import os
from pathlib import Path

from pantheon_cli.cli import build_parser, main
from pantheon_cli.serve import serve_environment


def environment(argv: list[str], environ: dict | None = None) -> dict[str, str]:
    return serve_environment(build_parser().parse_args(["serve", *argv]), environ or {})


def test_llama_server_flags_map_onto_the_settings(tmp_path):
    env = environment(
        ["-t", "3", "-c", "2048", "-np", "2", "--api-key", "k", "--data-dir", str(tmp_path)]
    )
    assert env == {
        "PANTHEON_THREADS": "3",
        "PANTHEON_CTX_CAP": "2048",
        "PANTHEON_MAX_SESSIONS": "2",
        "PANTHEON_API_KEY": "k",
        "PANTHEON_DATA_DIR": str(tmp_path.resolve()),
    }
    long = environment(["--threads", "3", "--ctx-size", "2048", "--parallel", "2"])
    assert long["PANTHEON_CTX_CAP"] == "2048" and long["PANTHEON_MAX_SESSIONS"] == "2"


def test_no_flag_sets_nothing():
    assert environment([]) == {}


def test_models_are_served_under_their_names_and_their_folders_allowed(tmp_path):
    a, b = tmp_path / "a" / "one.gguf", tmp_path / "b" / "two.gguf"
    env = environment([str(a), "-m", f"second={b}", "--models-dir", str(tmp_path / "more")])
    assert env["PANTHEON_MODELS"] == f"one={a},second={b}"
    dirs = env["PANTHEON_MODEL_DIRS"].split(os.pathsep)
    assert dirs[:3] == [str(tmp_path / "more"), str(a.parent), str(b.parent)]
    assert all(Path(d).is_absolute() for d in dirs)


def test_an_alias_names_the_one_model_and_the_environment_dirs_are_kept(tmp_path):
    env = environment(
        [str(tmp_path / "m.gguf"), "-a", "chat"], {"PANTHEON_MODEL_DIRS": "/srv/models"}
    )
    assert env["PANTHEON_MODELS"] == f"chat={tmp_path / 'm.gguf'}"
    assert env["PANTHEON_MODEL_DIRS"].split(os.pathsep) == [str(tmp_path), "/srv/models"]


def test_discover_switch():
    assert environment(["--discover"]) == {"PANTHEON_DISCOVER": "1"}


def test_help_and_no_command(capsys):
    assert main([]) == 2
    assert "serve" in capsys.readouterr().err
