"""``python -m rdmanet.ipam`` and the ``lease-ipam`` console script: one CNI call, exit code from skel."""

from __future__ import annotations

import sys

from rdmanet.cni.core import skel

from .plugin import LeaseIPAM


def main() -> None:
    sys.exit(skel.main(LeaseIPAM()))


if __name__ == "__main__":
    main()
