"""Fault injection for the crash tests: one plugin call, in this process, that dies at a named step
(``os._exit``, no cleanup of any kind), as a SIGKILL at that instant would leave things.

    python tests/crash_steps.py <plugin> <step>    (the CNI environment and stdin of the call)

The plugin's code is what runs in production: the function at the step's boundary is wrapped in
its module, in this process only (:func:`install`). :func:`runner` writes an executable that makes
this call, for tests that exec a plugin by path (a CNI client, the real-kernel tests).

lease-ipam, local store (exit :data:`STORE_EXIT`); an ADD of a dual-stack config goes through
them in this order:
  after-intent   the attachment's index (the intent listing every address) is written
  after-create   an address file is created, still empty
  after-address  one address file is complete
  before-cursor  every address file is complete, no cursor written
  after-cursor   the cursors are written: the allocation is done, not yet answered
  after-release  (DEL) the address files are removed, the index not yet

host-device-rdma (exit :data:`DEVICE_EXIT`, a SIGKILL's status):
  add:moved      ADD: the device is in the pod, named CNI_IFNAME, before MTU, MAC and up
  del:restored   DEL: in the pod, down, its MAC and MTU given back
  del:renamed    DEL: also under its own name again, not yet sent home
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Callable

STORE_EXIT = 86
DEVICE_EXIT = 137
PLUGINS = {
    "lease-ipam": ("rdmanet.ipam.plugin", "LeaseIPAM"),
    "host-device-rdma": ("rdmanet.plugins.host_device_rdma.plugin", "HostDeviceRdma"),
}
HERE = os.path.dirname(os.path.abspath(__file__))


def _die(code: int) -> None:
    os._exit(code)


def _before(function: Callable, code: int, when: Callable[..., bool] = lambda *a, **kw: True) -> Callable:
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        if when(*args, **kwargs):
            _die(code)
        return function(*args, **kwargs)

    return wrapper


def _after(function: Callable, code: int, when: Callable[..., bool] = lambda result: True) -> Callable:
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        result = function(*args, **kwargs)
        if when(result):
            _die(code)
        return result

    return wrapper


def _store_step(step: str) -> None:
    from rdmanet.ipam.store import local

    if step == "after-intent":  # the first write of an ADD is its index
        local.atomic_write = _after(local.atomic_write, STORE_EXIT)
    elif step == "after-create":
        def create_and_die(path: str, data: bytes, *args, **kwargs) -> bool:
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, local.FILE_MODE))
            except FileExistsError:
                return False  # as create_exclusive: the caller picks another address
            _die(STORE_EXIT)

        local.create_exclusive = create_and_die
    elif step == "after-address":
        local.create_exclusive = _after(local.create_exclusive, STORE_EXIT, lambda created: bool(created))
    elif step == "before-cursor":  # the intent and the address files are written
        local.LocalStore._claim_new = _after(local.LocalStore._claim_new, STORE_EXIT)
    elif step == "after-cursor":
        local.LocalStore._allocate_locked = _after(local.LocalStore._allocate_locked, STORE_EXIT)
    elif step == "after-release":  # the index goes last
        local.remove = _before(local.remove, STORE_EXIT,
                               lambda path: os.path.basename(os.path.dirname(path)) == local.INDEX_DIR)
    else:
        raise ValueError(f"no lease-ipam step {step!r}")


def _device_step(step: str) -> None:
    from rdmanet.plugins.host_device_rdma import moves

    if step == "add:moved":  # next: find the moved device in the pod, then configure it
        moves._followed = _before(moves._followed, DEVICE_EXIT)
    elif step == "del:restored":  # next: its own name again, in the pod
        moves._rename_unless_taken = _before(moves._rename_unless_taken, DEVICE_EXIT)
    elif step == "del:renamed":  # next: the move home
        moves._rename_unless_taken = _after(moves._rename_unless_taken, DEVICE_EXIT)
    else:
        raise ValueError(f"no host-device-rdma step {step!r}")


def install(plugin: str, step: str) -> None:
    """Make this process die at ``step`` of ``plugin``'s call (lease-ipam's also inside a plugin's ADD)."""
    if plugin == "lease-ipam":
        _store_step(step)
    elif plugin == "host-device-rdma":
        _device_step(step)
    else:
        raise ValueError(f"no crash steps for {plugin!r}")


def main(argv: list[str]) -> int:
    plugin, step = argv
    install(plugin, step)
    from rdmanet.cni.core import skel

    module, cls = PLUGINS[plugin]
    return skel.main(getattr(__import__(module, fromlist=[cls]), cls)())


def runner(directory: str, plugin: str, step: str, python: str = sys.executable) -> str:
    """An executable in ``directory`` that makes one call of ``plugin`` dying at ``step`` (its path)."""
    path = os.path.join(directory, f"{plugin}-dies-{step.replace(':', '-')}")
    with open(path, "w") as fh:
        fh.write(f"#!{python}\nimport sys\nsys.path.insert(0, {HERE!r})\nimport crash_steps\n"
                 f"sys.exit(crash_steps.main([{plugin!r}, {step!r}]))\n")
    os.chmod(path, 0o755)
    return path


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
