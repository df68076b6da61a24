"""`rdmanet version`: rdmanet's version, the interpreter's and every dependency rdmanet runs with."""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RDMANET = Path(sys.executable).parent / "rdmanet"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def run(*args: str) -> str:
    proc = subprocess.run([str(RDMANET), "version", *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return proc.stdout


def test_json_lists_the_closure_of_the_dependencies_not_the_test_extras():
    doc = json.loads(run("-o", "json"))
    assert doc["rdmanet"] == metadata.version("rdmanet") and doc["python"] == platform.python_version()
    deps = doc["dependencies"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for spec in project["dependencies"]:
        name = canonical(re.match(r"[A-Za-z0-9._-]+", spec).group(0))
        assert deps[name] == metadata.version(name), name
    # indirect ones too: what pydantic and kubernetes pull in
    for name in ("pydantic-core", "urllib3", "pyyaml"):
        assert deps[name] == metadata.version(name), name
    # the [test] extra is not what rdmanet runs with, and neither is the tooling of this venv
    for name in ("pytest", "hypothesis", "kubernetes-validate", "pip", "setuptools"):
        assert name not in deps, name
    assert list(deps) == sorted(deps)


def test_text_names_each_dependency_on_its_own_line():
    lines = run().splitlines()
    assert lines[0] == f"rdmanet {metadata.version('rdmanet')}"
    assert lines[1].startswith(f"python {platform.python_version()} (")
    listed = dict(line.split() for line in lines[2:])
    assert listed == json.loads(run("-o", "json"))["dependencies"]
