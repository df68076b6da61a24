"""Entry point of the ipoib-rdma executable."""

import sys


def main() -> None:
    from rdmanet.cni.core.skel import main as run
    from rdmanet.plugins.ipoib_rdma.plugin import IpoibRdma

    sys.exit(run(IpoibRdma()))


if __name__ == "__main__":
    main()
