"""How a shim's process ends after a call that ran in it (no daemon): rdmanet.node.launcher.finish skips
the interpreter's teardown of the call's modules but keeps what an exit does for the call."""

from __future__ import annotations

import pathlib
import subprocess
import sys

SHIM_DIR = str(pathlib.Path(__file__).resolve().parent.parent)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    prelude = f"import sys; sys.path.insert(0, {SHIM_DIR!r})\nfrom rdmanet.node import launcher\n"
    return subprocess.run([sys.executable, "-IS", "-c", prelude + code], capture_output=True, text=True, timeout=60,
                          check=False)


def test_finish_exits_with_the_code_after_the_exit_handlers_and_flushes(tmp_path):
    log = tmp_path / "plugin.log"
    proc = _run(
        "import atexit, logging\n"
        f"handler = logging.FileHandler({str(log)!r})\n"
        "logging.getLogger('p').addHandler(handler)\n"
        "logging.getLogger('p').warning('written through a buffered handler')\n"
        "atexit.register(lambda: sys.stdout.write(' and the exit handler ran'))\n"
        "class Module:\n"
        "    def __del__(self):\n"
        "        sys.stderr.write('torn down')\n"
        "keep = Module()\n"
        "sys.stdout.write('{\"cniVersion\": \"1.0.0\"}')  # no newline: only a flush writes it\n"
        "sys.stderr.write('a warning')\n"
        "launcher.finish(7)\n"
        "print('not reached')\n"
    )
    assert proc.returncode == 7
    assert proc.stdout == '{"cniVersion": "1.0.0"} and the exit handler ran'
    assert proc.stderr == "a warning"  # the module objects were not torn down
    assert log.read_text() == "written through a buffered handler\n"


def test_finish_leaves_the_exit_to_the_interpreter_while_another_thread_runs(tmp_path):
    done = tmp_path / "done"
    proc = _run(
        "import threading, time\n"
        "def work():\n"
        "    time.sleep(0.3)\n"
        f"    open({str(done)!r}, 'w').write('finished')\n"
        "threading.Thread(target=work).start()\n"
        "code = launcher.finish(3)\n"
        "print('returned', code)\n"
        "sys.exit(code)\n"
    )
    assert proc.returncode == 3
    assert proc.stdout == "returned 3\n"
    assert done.read_text() == "finished"  # the normal exit waited for the thread
