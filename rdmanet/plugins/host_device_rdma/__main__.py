"""Entry point of the host-device-rdma executable."""

import sys


def main() -> None:
    from rdmanet.cni.core.skel import main as run
    from rdmanet.plugins.host_device_rdma.plugin import HostDeviceRdma

    sys.exit(run(HostDeviceRdma()))


if __name__ == "__main__":
    main()
