"""Entry point of the macvlan-rdma executable."""

import sys


def main() -> None:
    from rdmanet.cni.core.skel import main as run
    from rdmanet.plugins.macvlan_rdma.plugin import MacvlanRdma

    sys.exit(run(MacvlanRdma()))


if __name__ == "__main__":
    main()
