"""The `pantheon` command's parser: the subcommands and their flags. Nothing here imports
Django: `pantheon --help`, `pantheon version` and `pantheon --backend` answer at once."""

from __future__ import annotations

import argparse
import sys

DESCRIPTION = """Pantheon: a self-hosted LLM inference server for GGUF models, with the
OpenAI, Anthropic and Ollama APIs. `pantheon serve MODEL.gguf` serves a model as
`llama-server -m MODEL.gguf` does."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pantheon", description=DESCRIPTION)
    parser.add_argument(
        "--backend",
        action="store_true",
        help="print the array backend this process would run on (cuda or cpu) and exit",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _serve_parser(sub)
    sub.add_parser(
        "cluster",
        help="Redis, serve instances and a router on loopback ports (as `make cluster`; "
        "its flags: pantheon cluster --help)",
    )
    sub.add_parser(
        "operator",
        help="create an operator account for the console at /console/ (createsuperuser; "
        "PANTHEON_DATA_DIR says which database)",
    )
    sub.add_parser(
        "manage", help="a Django management command (migrate, createsuperuser, shell, ...)"
    )
    sub.add_parser("version", help="print the version, the build and the backend")
    return parser


def _serve_parser(sub) -> None:
    serve = sub.add_parser(
        "serve",
        help="serve GGUF models over HTTP (migrates the database, starts Daphne)",
        description="Serve GGUF models. Flags are llama-server's where they mean the same; "
        "each sets the PANTHEON_* variable named in its help (README, Configuration). "
        "Equivalent to `daphne -b HOST -p PORT pantheon_site.asgi:application` with those "
        "variables set.",
    )
    serve.add_argument(
        "models",
        nargs="*",
        metavar="MODEL.gguf",
        help="models to serve, `path` (served under its file name) or `name=path` "
        "(PANTHEON_MODELS); none: the shipped model, or what the database had loaded",
    )
    serve.add_argument("-m", "--model", action="append", default=[], help="a model, as above")
    serve.add_argument(
        "-a", "--alias", help="the served name of the (one) model given (llama-server's)"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (8000)")
    serve.add_argument("-t", "--threads", type=int, help="engine threads (PANTHEON_THREADS)")
    serve.add_argument(
        "-c", "--ctx-size", type=int, help="context window per session (PANTHEON_CTX_CAP)"
    )
    serve.add_argument(
        "-np", "--parallel", type=int, help="sessions held at once (PANTHEON_MAX_SESSIONS)"
    )
    serve.add_argument("--api-key", help="key for the client routes (PANTHEON_API_KEY)")
    serve.add_argument(
        "--models-dir",
        action="append",
        default=[],
        help="a model folder models load from (PANTHEON_MODEL_DIRS; repeatable)",
    )
    serve.add_argument("--data-dir", help="database and secret key (PANTHEON_DATA_DIR)")
    serve.add_argument(
        "--discover",
        action="store_true",
        help="also list the GGUFs in Ollama's, LM Studio's and Hugging Face's caches "
        "(PANTHEON_DISCOVER=1)",
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in PASSED_THROUGH:
        # Their flags (--help included) are the wrapped command's, read by it.
        return passed_through(argv[0], argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.backend:
        from pantheon_platform.runtime import backend_name

        print(backend_name())
        return 0
    if args.command == "serve":
        from pantheon_cli.serve import serve

        return serve(args)
    if args.command == "version":
        from pantheon_cli.serve import version_line

        print(version_line())
        return 0
    parser.print_help(sys.stderr)
    return 2


PASSED_THROUGH = ("cluster", "operator", "manage")


def passed_through(command: str, rest: list[str]) -> int:
    """`pantheon cluster|operator|manage ...`: the rest of the command line is the wrapped
    command's (local_cluster's flags, createsuperuser's, a management command)."""
    if command == "cluster":
        from cluster import local_cluster

        sys.argv = ["pantheon cluster", *rest]  # its usage line says so
        return local_cluster.main(rest)
    from pantheon_cli.serve import manage

    # As manage.py's: the bind check (access/startup.py) reads `runserver ADDR` from it.
    sys.argv = ["manage.py", *(["createsuperuser"] if command == "operator" else []), *rest]

    if command == "operator":
        return manage(["createsuperuser", *rest])
    return manage(rest or ["help"])
