"""Run a shell script inside Debian's own kernel under qemu, to test what this host's kernel lacks.

``prepare.sh`` (beside this file) installs qemu and friends, unpacks the kernel package that
``linux-image-amd64`` depends on, extracts its ``vmlinux``, builds an initramfs and (once per
kernel) netdevsim.ko out of tree; it is idempotent and fast once done. ``vm_available()`` runs it
once per process and says why the VM cannot run (None when it can); ``netdevsim_module()`` gives
the module's path or why prepare.sh could not build it. ``run_in_vm(script)`` boots the kernel with 2 vCPUs and 1 GiB,
with the host's ``/`` read-only under a tmpfs overlay (so the checkout and its venv are visible at
the same paths, and writes vanish with the VM), and runs ``script`` with ``/bin/sh`` as root, a
child of the guest's PID 1. The script's stdout, stderr and exit code come back through a shared
read-write directory, mounted in the guest at the same path as on the host (``results_dir``), so
the script can leave more files there for the caller (its path is also in ``$RDMANET_VM_RESULTS``).

Under TCG (the default: see :func:`kvm_usable`) a boot costs a few seconds and each exec
of a dynamically linked program 0.1-0.3 s; importing pyroute2 costs seconds. Batch many checks into
one boot, and call the venv's real interpreter (``VENV_PYTHON``), never a pyenv shim.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parents[1]
PREPARE = HERE / "prepare.sh"
VENV_PYTHON = str(CHECKOUT / ".venv" / "bin" / "python") if (CHECKOUT / ".venv" / "bin" / "python").exists() else sys.executable
QEMU = "qemu-system-x86_64"
PREPARE_TIMEOUT = 900
TEMP_PREFIX = "rdmanet-vm-"
OWNER_FILE = ".owner-pid"


def cache_dir() -> Path:
    return Path(os.environ.get("RDMANET_VM_CACHE", "/var/cache/rdmanet-vm"))


@dataclass
class VMResult:
    """What a run left: ``returncode`` is None when the guest never reported one (timeout,
    boot failure). ``results_dir`` is the shared directory (stdout, stderr, rc, console.log,
    and whatever the script wrote); a directory ``run_in_vm`` created is removed by
    ``cleanup()``, on leaving a ``with`` block, or when the object is garbage-collected."""

    returncode: Optional[int]
    stdout: str
    stderr: str
    results_dir: str
    console: str = ""
    timed_out: bool = False
    accel: str = "tcg"
    seconds: float = 0.0  # qemu start to exit, on the host
    guest_seconds: Optional[float] = None  # the script's own run time, by the guest's clock
    _finalizer: Optional[weakref.finalize] = field(default=None, repr=False, compare=False)

    def file(self, name: str) -> str:
        return (Path(self.results_dir) / name).read_text(encoding="utf-8", errors="replace")

    def describe(self) -> str:
        """A summary for assertion messages: exit code, timings, the tails of the outputs."""
        tail = lambda s, n=3000: s[-n:]  # noqa: E731
        return (
            f"returncode={self.returncode} timed_out={self.timed_out} accel={self.accel} "
            f"seconds={self.seconds:.1f} guest_seconds={self.guest_seconds}\n"
            f"--- stdout ---\n{tail(self.stdout)}\n--- stderr ---\n{tail(self.stderr)}\n"
            f"--- console ---\n{tail(self.console)}"
        )

    def cleanup(self) -> None:
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self) -> "VMResult":
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()


# --------------------------------------------------------------------------- availability

_available: Optional[tuple[Optional[str], str]] = None


def vm_available() -> Optional[str]:
    """None when ``run_in_vm`` can run; otherwise the reason (not root, prepare failed, qemu
    missing, ...). Runs prepare.sh on the first call (its output: ``prepare_log()``)."""
    global _available
    if _available is None:
        _available = _check_available()
    return _available[0]


def prepare_log() -> str:
    vm_available()
    return _available[1] if _available else ""


def _check_available() -> tuple[Optional[str], str]:
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        return "the test VM needs an x86_64 Linux host", ""
    if os.environ.get("RDMANET_VM") == "1":
        return "already inside the test VM", ""
    if os.geteuid() != 0:
        return "the test VM needs root (prepare.sh installs packages; qemu reads the whole host root)", ""
    if shutil.which("apt-get") is None and not (cache_dir() / "vm.env").exists():
        return "the test VM needs a Debian host (apt-get) to fetch the kernel", ""
    try:
        proc = subprocess.run(
            ["bash", str(PREPARE)], capture_output=True, text=True, timeout=PREPARE_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired:
        return f"prepare.sh took longer than {PREPARE_TIMEOUT} s", ""
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
        return f"prepare.sh failed (exit {proc.returncode}): {last}", log
    if shutil.which(QEMU) is None:
        return f"{QEMU} missing after prepare.sh", log
    try:
        env = _vm_env()
    except (OSError, KeyError) as e:
        return f"prepare.sh left no usable {cache_dir() / 'vm.env'}: {e}", log
    for key in ("RDMANET_VM_VMLINUX", "RDMANET_VM_INITRD"):
        if not os.path.isfile(env[key]):
            return f"{env[key]} missing after prepare.sh", log
    return None, log


def _vm_env() -> dict[str, str]:
    env = {}
    with open(cache_dir() / "vm.env", encoding="utf-8") as f:
        for line in f:
            key, sep, value = line.strip().partition("=")
            if sep:
                env[key] = value
    for key in ("RDMANET_VM_VMLINUX", "RDMANET_VM_INITRD", "RDMANET_VM_KVER"):
        env[key]  # raises KeyError when missing
    return env


def netdevsim_module() -> tuple[Optional[str], Optional[str]]:
    """``(path of netdevsim.ko, None)`` when prepare.sh built it for the VM kernel, else
    ``(None, why not)``. Debian's kernel has no netdevsim; prepare.sh builds it out of tree once
    per kernel and, when that fails, records why in the file named by
    RDMANET_VM_NETDEVSIM_ERROR_FILE instead of failing (the rxe tests do not need it)."""
    try:
        env = _vm_env()
    except (OSError, KeyError) as e:
        return None, f"no usable {cache_dir() / 'vm.env'}: {e}"
    path = env.get("RDMANET_VM_NETDEVSIM", "")
    if path and os.path.isfile(path):
        return path, None
    if path:
        return None, f"{path} (RDMANET_VM_NETDEVSIM in vm.env) is missing"
    error_file = env.get("RDMANET_VM_NETDEVSIM_ERROR_FILE", "")
    if not error_file:
        return None, "vm.env has no RDMANET_VM_NETDEVSIM: it was written by an older prepare.sh"
    try:
        reason = Path(error_file).read_text(encoding="utf-8", errors="replace").strip()
    except OSError as e:
        reason = f"(cannot read {error_file}: {e})"
    return None, f"prepare.sh could not build netdevsim.ko: {reason or 'no reason recorded'}"


def kvm_usable() -> bool:
    """KVM only when the CPU shows vmx/svm and /dev/kvm opens; this workplace's /dev/kvm is a
    nested software hypervisor without vmx/svm that cannot run a stock kernel (measured: Debian's
    kernel does not boot under it with -enable-kvm)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    if "vmx" not in flags and "svm" not in flags:
        return False
    return os.access("/dev/kvm", os.R_OK | os.W_OK)


def _accels() -> list[str]:
    forced = os.environ.get("RDMANET_VM_ACCEL", "").strip().lower()
    if forced in ("tcg", "kvm"):
        return [forced]
    return ["kvm", "tcg"] if kvm_usable() else ["tcg"]


# --------------------------------------------------------------------------- running


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no qemu outlives a killed test run


def qemu_command(results: str, accel: str, env: dict[str, str], *, memory_mb: int = 1024, cpus: int = 2) -> list[str]:
    cpu = ["-cpu", "host"] if accel == "kvm" else ["-cpu", "max"]
    accel_opt = "kvm" if accel == "kvm" else "tcg,thread=multi"
    return [
        QEMU,
        "-machine", "pc", "-accel", accel_opt, *cpu,
        "-smp", str(cpus), "-m", str(memory_mb),
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-nic", "none",
        "-kernel", env["RDMANET_VM_VMLINUX"],
        "-initrd", env["RDMANET_VM_INITRD"],
        "-append", f"console=ttyS0 quiet panic=-1 rdmanet.results={results}",
        "-serial", f"file:{results}/console.log",
        "-virtfs", "local,path=/,mount_tag=hostroot,security_model=passthrough,readonly=on,multidevs=remap",
        "-virtfs", f"local,path={results},mount_tag=results,security_model=passthrough,multidevs=remap",
    ]  # fmt: skip


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def run_in_vm(script: str, timeout: float = 180, results_dir: Optional[str] = None) -> VMResult:
    """Boot the VM, run ``script`` (``/bin/sh``, as root) in it and power off.

    ``results_dir``: a directory to share with the guest (kept); by default a new temporary one,
    removed by ``VMResult.cleanup()``. Its path must not contain whitespace or commas. qemu is killed after
    ``timeout`` seconds (``returncode`` None, ``timed_out`` True). Raises RuntimeError when the
    VM is not available (see ``vm_available()``).
    """
    reason = vm_available()
    if reason is not None:
        raise RuntimeError(f"the test VM is not available: {reason}")
    env = _vm_env()
    own = results_dir is None
    if own:
        _sweep_orphans()
    results = tempfile.mkdtemp(prefix=TEMP_PREFIX) if own else os.path.abspath(results_dir)
    try:
        if any(c.isspace() or c == "," for c in results):  # kernel command line, qemu options
            raise ValueError(f"the results dir path must not contain whitespace or commas: {results!r}")
        os.makedirs(results, exist_ok=True)
        if own:
            Path(results, OWNER_FILE).write_text(f"{os.getpid()}\n", encoding="ascii")
        with open(os.path.join(results, "run.sh"), "w", encoding="utf-8") as f:
            f.write(script)
        result = None
        for accel in _accels():
            for name in ("stdout", "stderr", "rc", "console.log", "uptime.start", "uptime.end"):
                Path(results, name).unlink(missing_ok=True)
            result = _boot(results, accel, env, timeout)
            if result.returncode is not None:
                break
    except BaseException:
        if own:
            shutil.rmtree(results, ignore_errors=True)
        raise
    if own:
        result._finalizer = weakref.finalize(result, shutil.rmtree, results, True)
    return result


def _sweep_orphans() -> None:
    """Remove result dirs of earlier runs whose process died without cleaning up (SIGKILL)."""
    base = Path(tempfile.gettempdir())
    for path in base.glob(f"{TEMP_PREFIX}*"):
        try:
            pid = int((path / OWNER_FILE).read_text(encoding="ascii").strip())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            pass


def _boot(results: str, accel: str, env: dict[str, str], timeout: float) -> VMResult:
    cmd = qemu_command(results, accel, env)
    start = time.monotonic()
    timed_out = False
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
    )
    try:
        qemu_out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        proc.kill()
        qemu_out, _ = proc.communicate()
    finally:
        if proc.poll() is None:  # interrupted (KeyboardInterrupt, ...): never leave qemu behind
            proc.kill()
            proc.wait()
    seconds = time.monotonic() - start
    base = Path(results)
    rc_text = _read(base / "rc").strip()
    returncode = int(rc_text) if rc_text.lstrip("-").isdigit() else None
    console = _read(base / "console.log")
    qemu_text = qemu_out.decode("utf-8", errors="replace").strip()
    if qemu_text:
        console += f"\n[qemu exit {proc.returncode}] {qemu_text}"
    guest_seconds = None
    try:
        guest_seconds = round(float(_read(base / "uptime.end")) - float(_read(base / "uptime.start")), 2)
    except ValueError:
        pass
    return VMResult(
        returncode=returncode,
        stdout=_read(base / "stdout"),
        stderr=_read(base / "stderr"),
        results_dir=results,
        console=console,
        timed_out=timed_out,
        accel=accel,
        seconds=seconds,
        guest_seconds=guest_seconds,
    )


if __name__ == "__main__":  # python netns_tests/vm/harness.py 'uname -r'
    why = vm_available()
    if why:
        print(f"VM not available: {why}\n{prepare_log()}", file=sys.stderr)
        sys.exit(2)
    with run_in_vm(" ".join(sys.argv[1:]) or "uname -a") as r:
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr)
        if r.returncode is None:
            print(r.describe(), file=sys.stderr)
        print(f"[vm: rc={r.returncode} {r.seconds:.1f} s, accel {r.accel}]", file=sys.stderr)
        sys.exit(r.returncode if r.returncode is not None else 1)
