"""Entry point of the ipoib-rdma executable."""

import sys


def main() -> None:
    from cni.core.skel import main as run
    from cni.ipoib_rdma.plugin import IpoibRdma

    sys.exit(run(IpoibRdma()))


if __name__ == "__main__":
    main()
