"""The `pantheon` command. Importable without Django: a deploy script runs
`pantheon --backend` to assert what this install can run on."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pantheon", description=__doc__)
    parser.add_argument(
        "--backend",
        action="store_true",
        help="print the array backend this process would run on (cuda or cpu) and exit",
    )
    args = parser.parse_args(argv)
    if args.backend:
        from pantheon_platform.runtime import backend_name

        print(backend_name())
        return 0
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
