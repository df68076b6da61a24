"""InfiniBand values as configs and results carry them: partition keys, GUIDs, IPoIB addresses.

Pure logic, no kernel I/O (facts: the kernel's drivers/infiniband/ulp/ipoib/ipoib.h and ipoib_main.c,
include/uapi/linux/if_link.h; ib-sriov-cni's pkg/utils/utils.go ``GetGUIDFromHwAddr``):

- A partition key (pkey) is 15 bits; bit 15 (0x8000) is full membership. IPoIB netdevs always
  carry it (``ipoib_ndo_init`` ORs it in), so 0x0001 and 0x8001 name the same partition. 0 and
  0x8000 are invalid keys. Configs give it as a JSON number or a hex string ("0x8001", "0x1").
- An IPoIB hardware address is 20 bytes: flags (0x80 = connected mode capable), 3 bytes of QPN,
  then the 16-byte port GID whose last 8 bytes are the port GUID.
- A GUID is 8 octets written ``11:22:33:44:55:66:77:88``; as a number it is read big-endian
  (iproute2, vishvananda/netlink). All-zero is "unset", all-ones is what ib-sriov-cni writes back
  for an unset one.
"""

from __future__ import annotations

import hashlib
import re
from typing import Union

PKEY_FULL_MEMBER = 0x8000
PKEY_MASK = 0x7FFF
MODES = ("datagram", "connected")
IPOIB_MODE = {"datagram": 0, "connected": 1}  # IPOIB_MODE_DATAGRAM / _CONNECTED (if_link.h)
IPOIB_HWADDR_LEN = 20
IPOIB_CM_CAPABLE = 0x80  # byte 0 of the hardware address
CONNECTED_MAX_MTU = 65520  # IPOIB_CM_MTU: 0x10000 - 0x10
DATAGRAM_MAX_MTU = 4092  # IB MTU 4096 - 4 bytes of IPoIB header (2044 on 2K fabrics)
MIN_MTU = 68
ZERO_GUID = 0
ALL_ONES_GUID = 0xFFFF_FFFF_FFFF_FFFF

_GUID_RE = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){7}$")
_HEX_RE = re.compile(r"^0[xX][0-9a-fA-F]{1,4}$")


def parse_pkey(value: Union[int, str]) -> int:
    """The 15-bit partition key of a config value; ValueError naming the rule when invalid."""
    if isinstance(value, bool):
        raise ValueError(f"pkey {value!r} is not a number")
    if isinstance(value, str):
        if not _HEX_RE.fullmatch(value.strip()):
            raise ValueError(f"pkey {value!r} is not a hex partition key such as \"0x8001\" or \"0x7fff\"")
        number = int(value.strip(), 16)
    elif isinstance(value, int):
        number = value
    else:
        raise ValueError(f"pkey {value!r} is not a number or a hex string")
    if not 0 <= number <= 0xFFFF:
        raise ValueError(f"pkey {value!r} is out of range: a partition key is 0x0001-0x7fff "
                         "(0x8001-0xffff with the full-member bit)")
    if number & PKEY_MASK == 0:
        raise ValueError(f"pkey {value!r} is not a valid partition key (0x0000 and 0x8000 are reserved)")
    return number & PKEY_MASK


def pkey_text(pkey: int) -> str:
    """How a pkey is shown: the full-member form the kernel reports, ``0x8001``."""
    return f"0x{(pkey & PKEY_MASK) | PKEY_FULL_MEMBER:04x}"


def mtu_limit(mode: str, master_mode: str, master_mtu: int) -> int:
    """The largest MTU an IPoIB child in ``mode`` can take (``ipoib_change_mtu``): connected mode
    up to 65520; datagram mode up to the IB MTU - 4, which the master shows as its MTU while it is
    itself in datagram mode (its admin MTU can only be lower), else 4092 (a 4K fabric)."""
    if mode == "connected":
        return CONNECTED_MAX_MTU
    if master_mode == "datagram" and MIN_MTU <= master_mtu <= DATAGRAM_MAX_MTU:
        return master_mtu
    return DATAGRAM_MAX_MTU


def parse_guid(value: str) -> int:
    """A GUID ``11:22:33:44:55:66:77:88`` as its number; ValueError for anything else (Go's
    ParseMAC forms with 6 or 20 octets included: a VF GUID is exactly 8), all-zero or all-ones."""
    if not isinstance(value, str) or not _GUID_RE.fullmatch(value.strip()):
        raise ValueError(f"{value!r} is not a GUID of 8 octets such as 02:00:00:00:00:00:00:01")
    number = int(value.strip().replace(":", ""), 16)
    if number == ZERO_GUID:
        raise ValueError(f"{value!r} is the all-zero GUID, which means 'unset'")
    if number == ALL_ONES_GUID:
        raise ValueError(f"{value!r} is the all-ones GUID, which means 'unset'")
    return number


def guid_text(number: int) -> str:
    """``11:22:33:44:55:66:77:88`` for a GUID number (big-endian, like iproute2 prints it)."""
    return ":".join(f"{b:02x}" for b in number.to_bytes(8, "big"))


def guid_of_sysfs(text: str) -> int:
    """A GUID as sysfs shows it (``node_guid``: ``b859:9f03:00d4:6e2a``); ValueError otherwise."""
    digits = text.strip().replace(":", "")
    if len(digits) != 16 or not re.fullmatch(r"[0-9a-fA-F]{16}", digits):
        raise ValueError(f"{text!r} is not a GUID")
    return int(digits, 16)


def derive_guid(seed: str) -> int:
    """A stable GUID for an attachment: 0x02 (the first byte of ib-kubernetes' default pool,
    02:00:00:00:00:00:00:00-02:ff:...) then 7 bytes of SHA-256 of ``seed``. The same seed always
    gives the same GUID, so a repeated ADD after a crash sets the same one."""
    digest = hashlib.sha256(seed.encode()).digest()
    number = int.from_bytes(b"\x02" + digest[:7], "big")
    return number if number not in (ZERO_GUID, ALL_ONES_GUID) else number ^ 1


def parse_hwaddr(text: str) -> bytes:
    """The 20 bytes of an IPoIB hardware address written as colon hex; ValueError otherwise."""
    parts = text.strip().split(":")
    if len(parts) != IPOIB_HWADDR_LEN or not all(re.fullmatch(r"[0-9a-fA-F]{2}", p) for p in parts):
        raise ValueError(f"{text!r} is not a 20-byte IPoIB hardware address")
    return bytes(int(p, 16) for p in parts)


def guid_of_hwaddr(text: str) -> int:
    """The port GUID in an IPoIB hardware address (its bytes 12-19, ib-sriov-cni's
    GetGUIDFromHwAddr)."""
    return int.from_bytes(parse_hwaddr(text)[12:20], "big")


def connected_capable(text: str) -> bool:
    """True when the hardware address has the RC flag, i.e. connected mode can be set."""
    return bool(parse_hwaddr(text)[0] & IPOIB_CM_CAPABLE)
