"""CNI error codes and the one exception type every verb raises to report failure.

A plugin prints the error as JSON on stdout and exits non-zero (SPEC section "Error").
Codes 1-99 are the spec's; 100 and up are rdmanet's own and are listed in README.md.
"""

from __future__ import annotations

# Spec codes (containernetworking/cni SPEC.md, pkg/types/types.go).
INCOMPATIBLE_VERSION = 1
UNSUPPORTED_FIELD = 2
UNKNOWN_CONTAINER = 3
INVALID_ENVIRONMENT = 4
IO_FAILURE = 5
DECODING_FAILURE = 6
INVALID_CONFIG = 7
INVALID_NETNS = 8
TRY_AGAIN_LATER = 11
NOT_AVAILABLE = 50
NOT_AVAILABLE_DEGRADED = 51
INTERNAL = 999

# rdmanet codes (100+).
LINK_FAILURE = 100  # the kernel refused a link operation
RDMA_MISMATCH = 101  # the RDMA requirement of the config is not met on this host
POOL_EXHAUSTED = 102  # no free address in a range
ADDRESS_UNAVAILABLE = 103  # a requested address is taken or outside every range
IPAM_FAILURE = 104  # the delegated IPAM plugin failed or returned garbage
CHECK_FAILED = 105  # CHECK found the attachment differs from what ADD made
DEVICE_BUSY = 106  # the device is allocated to another live pod
ADDRESS_CONFLICT = 107  # another host answers for the address (detectAddressConflict)
GATEWAY_UNREACHABLE = 108  # the gateway does not answer (checkGateway)


class CNIError(Exception):
    """A failure reported to the runtime as ``{cniVersion, code, msg, details}``."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.details = details

    def to_dict(self, cni_version: str) -> dict:
        out = {"cniVersion": cni_version, "code": self.code, "msg": self.msg}
        if self.details:
            out["details"] = self.details
        return out

    def __repr__(self) -> str:
        return f"CNIError({self.code}, {self.msg!r}, {self.details!r})"


def check_failed(msg: str) -> CNIError:
    """CHECK found the attachment differs from what ADD made."""
    return CNIError(CHECK_FAILED, f"CHECK: {msg}", "DEL and ADD the attachment again to repair it")
