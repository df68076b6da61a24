"""``python recipe_calls.py SPEC.json``: CNI calls through rdmanet's shims, as a runtime execs them,
in the mount namespace the caller set up (netns_tests/test_doc_recipes.py binds a kubeconfig
directory over /etc/cni/net.d there). With ``"mode": "daemon"`` an ``rdmanet daemon`` serves the
shims, started inside that namespace too (a daemon outside it would not see the files).

SPEC: ``{"mode", "python", "calls": [{"plugin", "env", "stdin"}]}``; prints
``[{"rc", "stdout", "stderr"}]`` as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from rdmanet.node.testing import Daemon, write_shims


def main(path: str) -> int:
    with open(path) as f:
        spec = json.load(f)
    out = []
    with tempfile.TemporaryDirectory(prefix="rdmanet-recipe-") as tmp:
        sock = os.path.join(tmp, "run", "daemon.sock")
        write_shims(os.path.join(tmp, "bin"), sock, python=spec["python"])
        daemon = Daemon(sock) if spec["mode"] == "daemon" else None
        try:
            for call in spec["calls"]:
                env = {**call["env"], "CNI_PATH": os.path.join(tmp, "bin")}
                proc = subprocess.run([os.path.join(tmp, "bin", call["plugin"])], input=call["stdin"].encode(), env=env,
                                      capture_output=True, timeout=120)
                out.append({"rc": proc.returncode, "stdout": proc.stdout.decode(errors="replace"),
                            "stderr": proc.stderr.decode(errors="replace")[-4000:]})
            if daemon is not None:  # served by it, not by the shims' in-process fallback
                served = daemon.log().count('"event": "call"')
                if served != len(spec["calls"]):
                    sys.stderr.write(f"the daemon served {served} of {len(spec['calls'])} calls: {daemon.log()}\n")
                    return 1
        finally:
            if daemon is not None:
                daemon.cleanup()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
