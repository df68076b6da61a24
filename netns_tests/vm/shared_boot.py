"""One test-VM boot per pytest process, shared by every ``netns_tests/test_vm_*.py`` module.

A boot costs tens of seconds under TCG, so ``guest_checks.py`` runs every kernel check (rdma_rxe,
then the SR-IOV VF settings on netdevsim) in ONE boot and writes one JSON report; each test
module's fixture calls :func:`guest_report`, which boots on the first call and hands the same
``(report, run)`` to every later caller. A failed boot is remembered too: every module fails with
the same message instead of booting again. The run's results directory is removed when the
process exits (VMResult's finalizer).

No conftest is involved (``netns_tests/conftest.py`` belongs to the root netns suite), so this
works whichever of the modules pytest collects, alone or together.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from typing import Any, Optional

from . import harness

GUEST_SCRIPT = "netns_tests/vm/guest_checks.py"
TIMEOUT = 480  # qemu start to power-off; the checks take 2-4 minutes under TCG, longer on a loaded host

_report: Optional[tuple[dict, harness.VMResult]] = None
_failure: Optional[str] = None


def _say(request: Any, text: str) -> None:
    """Print, and show it in pytest's normal output too (not only in captured output)."""
    capture = request.config.pluginmanager.get_plugin("capturemanager") if request is not None else None
    if capture is None:
        print(text)
        return
    with capture.global_and_fixture_disabled():
        print(text)


def guest_command() -> str:
    """The guest's shell script: the checks with the venv's interpreter, told where netdevsim.ko
    is (or why there is none, so the report says it)."""
    ko, why = harness.netdevsim_module()
    nsim = f"--netdevsim {shlex.quote(ko)}" if ko else f"--netdevsim-error {shlex.quote(why or '')}"
    return (f"cd {shlex.quote(str(harness.CHECKOUT))} && "
            f"exec {shlex.quote(harness.VENV_PYTHON)} -B {GUEST_SCRIPT} {nsim}\n")


def guest_report(request: Any = None) -> tuple[dict, harness.VMResult]:
    """``(report, run)`` of the session's one boot (booting now if none ran yet). Raises
    AssertionError when the guest checks did not complete (callers are pytest fixtures)."""
    global _report, _failure
    if _report is not None:
        return _report
    if _failure is not None:
        raise AssertionError(f"(the shared VM boot failed earlier in this session)\n{_failure}")
    # up-to-date bytecode on the host, so the guest (read-only root) compiles nothing
    subprocess.run(
        [harness.VENV_PYTHON, "-m", "compileall", "-q", "cni", "ipam", "netns_tests/vm"],
        cwd=harness.CHECKOUT, capture_output=True, check=False, timeout=120,
    )
    start = time.monotonic()
    run = harness.run_in_vm(guest_command(), timeout=TIMEOUT)
    elapsed = time.monotonic() - start
    _say(request, f"\n[test VM] boot + checks: {elapsed:.1f} s on the host ({run.accel}); "
                  f"checks in the guest: {run.guest_seconds} s")
    try:
        if run.returncode != 0:
            raise AssertionError(f"guest checks did not complete:\n{run.describe()}")
        report = json.loads(run.file("checks.json"))
    except (AssertionError, OSError, ValueError) as exc:
        _failure = str(exc) if isinstance(exc, AssertionError) else f"no readable checks.json: {exc}\n{run.describe()}"
        run.cleanup()
        raise AssertionError(_failure) from None
    _say(request, "[test VM] sections: " + ", ".join(
        f"{name} {entry['seconds']} s{'' if entry.get('ok') else ' FAILED'}"
        for name, entry in report.items() if isinstance(entry, dict) and "seconds" in entry
    ))
    _report = (report, run)
    return _report


def section(vm: tuple[dict, harness.VMResult], name: str) -> dict:
    """The report's ``name`` entry; fails with the guest's traceback when that section failed."""
    report, run = vm
    entry = report.get(name)
    assert entry is not None, f"no {name!r} in the guest report:\n{run.describe()}"
    assert entry["ok"], (f"guest section {name!r} failed:\n{entry.get('error')}\n"
                         f"import: {report.get('import_error') or report.get('vf_import_error')}")
    return entry
