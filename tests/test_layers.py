"""The package's layers: a lower layer never imports a higher one (module-level or inside a
function), so the protocol core and the host operations stay usable without the plugins, the
IPAM without the daemon, and nothing below the CLI depends on it."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "rdmanet"

# layer -> the layers it may import (besides itself); a plugin may not import another plugin
ALLOWED = {
    "rdmanet.cni.core": set(),
    "rdmanet.cni.linux": {"rdmanet.cni.core"},
    "rdmanet.plugins": {"rdmanet.cni.core", "rdmanet.cni.linux"},
    "rdmanet.ipam": {"rdmanet.cni.core", "rdmanet.cni.linux"},
    "rdmanet.node": {"rdmanet.cni.core", "rdmanet.cni.linux", "rdmanet.plugins", "rdmanet.ipam"},
    "rdmanet.cli": {"rdmanet.cni.core", "rdmanet.cni.linux", "rdmanet.plugins", "rdmanet.ipam", "rdmanet.node"},
}


def layer_of(module: str) -> str | None:
    return next((layer for layer in sorted(ALLOWED, key=len, reverse=True)
                 if module == layer or module.startswith(layer + ".")), None)


def unit_of(module: str) -> str | None:
    """The layer, or for a plugin its own package (plugins are separate units)."""
    layer = layer_of(module)
    if layer == "rdmanet.plugins":
        parts = module.split(".")
        return ".".join(parts[:3]) if len(parts) > 2 else layer
    return layer


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: pathlib.Path, source: str) -> list[tuple[int, str]]:
    """Every rdmanet module ``path`` (whose text is ``source``) imports, relative imports resolved."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out += [(node.lineno, f"{target}.{a.name}") for a in node.names]
    return [(line, target) for line, target in out if target.split(".")[0] == "rdmanet"]


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if layer_of(module_name(p)))


def test_every_module_is_in_a_layer():
    loose = [module_name(p) for p in PACKAGE.rglob("*.py") if not layer_of(module_name(p))]
    assert loose == ["rdmanet", "rdmanet.cni"], loose  # docstring-only package inits


def violations(path: pathlib.Path, source: str) -> list[str]:
    own = unit_of(module_name(path))
    layer = layer_of(module_name(path))
    wrong = []
    for line, target in imports_of(path, source):
        other = unit_of(target)
        if other is None or other == own:
            continue
        if layer_of(target) not in ALLOWED[layer] or (layer == "rdmanet.plugins" == layer_of(target)):
            wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}")
    return wrong


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: module_name(p))
def test_no_lower_layer_imports_a_higher_one(path):
    wrong = violations(path, path.read_text())
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_a_violation():
    """The rule itself: an ipam module importing the CLI (at module level or in a function), or one
    plugin another, is caught; the same module importing the core is not."""
    ipam = PACKAGE / "ipam" / "reconcile.py"
    assert violations(ipam, "from rdmanet.cli.ipam_cli import table\ndef f():\n    from ..node import daemon\n"
                            "from rdmanet.cni.core import errors\n") == [
        "rdmanet/ipam/reconcile.py:1 imports rdmanet.cli.ipam_cli.table",
        "rdmanet/ipam/reconcile.py:3 imports rdmanet.node.daemon"]
    plugin = PACKAGE / "plugins" / "ipoib_rdma" / "plugin.py"
    assert violations(plugin, "from ..macvlan_rdma import config\nfrom .config import X\n") == [
        "rdmanet/plugins/ipoib_rdma/plugin.py:1 imports rdmanet.plugins.macvlan_rdma.config"]
