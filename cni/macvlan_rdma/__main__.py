"""Entry point of the macvlan-rdma executable."""

import sys


def main() -> None:
    from cni.core.skel import main as run
    from cni.macvlan_rdma.plugin import MacvlanRdma

    sys.exit(run(MacvlanRdma()))


if __name__ == "__main__":
    main()
