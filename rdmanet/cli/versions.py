"""`rdmanet version`: rdmanet's version, the interpreter's, and every installed dependency's.

The dependencies are the closure of rdmanet's own requirements over what is installed (extras
such as ``[test]`` are not followed), so the list is what the image's venv really runs: the pins of
deploy/requirements.lock in the image, whatever pip resolved elsewhere.
"""

from __future__ import annotations

import json
import platform
import re
import sys
from importlib import metadata

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_EXTRA_MARKER = re.compile(r"\bextra\s*==")


def canonical(name: str) -> str:
    """PEP 503 normalised name (``Typing_Extensions`` -> ``typing-extensions``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _required(dist: metadata.Distribution) -> list[str]:
    out = []
    for req in dist.requires or []:
        spec, _, marker = req.partition(";")
        if _EXTRA_MARKER.search(marker):
            continue
        m = _NAME.match(spec.strip())
        if m:
            out.append(canonical(m.group(0)))
    return out


def dependencies(root: str = "rdmanet") -> dict[str, str]:
    """{name: version} of every installed distribution ``root`` needs, directly or not."""
    found: dict[str, str] = {}
    todo = _required(metadata.distribution(root))
    while todo:
        name = todo.pop()
        if name in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a requirement whose marker excludes this interpreter
        found[name] = dist.version
        todo.extend(_required(dist))
    return dict(sorted(found.items()))


def report() -> dict:
    return {"rdmanet": metadata.version("rdmanet"), "python": platform.python_version(),
            "executable": sys.executable, "dependencies": dependencies()}


def run(output: str = "text") -> int:
    doc = report()
    if output == "json":
        print(json.dumps(doc, indent=2))
        return 0
    print(f"rdmanet {doc['rdmanet']}")
    print(f"python {doc['python']} ({doc['executable']})")
    for name, version in doc["dependencies"].items():
        print(f"  {name} {version}")
    return 0
