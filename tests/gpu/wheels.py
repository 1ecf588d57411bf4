"""What the GPU machine lacks to run the server: prints `name==version` for each
distribution the project's runtime dependencies need (their closure, at the versions
installed here) that the device image does not already hold. `make gpu-wheels` downloads
these as Python 3.12 wheels into .whl/ for tests/gpu/run-on-device.sh to install.

DEVICE_HAS: the packages of the device's image that our closure meets, as the device
tool's page lists them (/work/.library/device/KINDS.md, "Python packages already there");
carrying a second version of one would shadow the image's (numpy and CuPy above all).
"""

from __future__ import annotations

import importlib.metadata as md
import re

from packaging.requirements import Requirement

DEVICE_HAS = {
    "anyio", "attrs", "certifi", "charset-normalizer", "click", "filelock", "fsspec", "h11",
    "hf-xet", "httpcore", "httpx", "huggingface-hub", "idna", "jinja2", "markupsafe",
    "msgpack", "numpy", "packaging", "prometheus-client", "psutil", "pyyaml", "regex",
    "requests", "threadpoolctl", "tokenizers", "tqdm", "typing-extensions", "urllib3",
}  # fmt: skip


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(names) -> dict[str, str]:
    """{canonical name: installed version} of `names` and everything they require."""
    found: dict[str, str] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = canonical(name)
        if key in found or key in DEVICE_HAS:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        found[key] = dist.version
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return found


def main() -> None:
    runtime = [
        Requirement(r).name
        for r in md.requires("pantheon") or ()
        if "extra ==" not in r  # the project's own dependencies, not its extras
    ]
    for name, version in sorted(closure(runtime).items()):
        print(f"{name}=={version}")


if __name__ == "__main__":
    main()
