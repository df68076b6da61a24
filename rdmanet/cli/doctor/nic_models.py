"""Names of RDMA NICs by PCI vendor:device id, for ``rdmanet doctor``.

Facts (the device ids the Linux mlx4/mlx5 drivers match, and the names lspci prints):

- Vendor 0x15b3 is Mellanox, now NVIDIA networking.
- ConnectX-3/-3 Pro are driven by ``mlx4_core`` (+ ``mlx4_ib``); Connect-IB, ConnectX-4 and later
  and the BlueField DPUs by ``mlx5_core`` (+ ``mlx5_ib`` for RDMA).
- Up to ConnectX-6 each generation has its own VF device id. From ConnectX-6 Dx on (6 Dx, 6 Lx,
  7, 8, BlueField-2/3) every VF is 0x101e, "ConnectX Family mlx5Gen Virtual Function": the
  model of such a VF is that of its PF. (So 0x101e is not "a ConnectX-7 VF" specifically.)
- The BlueField DPUs carry a ConnectX: BlueField = ConnectX-5, BlueField-2 = ConnectX-6 Dx,
  BlueField-3 = ConnectX-7, BlueField-4 = ConnectX-8.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

MELLANOX = "15b3"

VENDORS = {
    "15b3": "NVIDIA/Mellanox",
    "8086": "Intel",
    "14e4": "Broadcom",
    "19e5": "Huawei",
    "1077": "QLogic",
    "1d0f": "Amazon",
}

MLX4 = "mlx4_core"
MLX5 = "mlx5_core"


@dataclass(frozen=True)
class NicModel:
    name: str
    vf: bool  # a virtual function id
    driver: str  # the kernel driver that binds it for netdev use


_MODELS = {
    "1003": NicModel("ConnectX-3", False, MLX4),
    "1004": NicModel("ConnectX-3/ConnectX-3 Pro VF", True, MLX4),
    "1007": NicModel("ConnectX-3 Pro", False, MLX4),
    "1011": NicModel("Connect-IB", False, MLX5),
    "1012": NicModel("Connect-IB VF", True, MLX5),
    "1013": NicModel("ConnectX-4", False, MLX5),
    "1014": NicModel("ConnectX-4 VF", True, MLX5),
    "1015": NicModel("ConnectX-4 Lx", False, MLX5),
    "1016": NicModel("ConnectX-4 Lx VF", True, MLX5),
    "1017": NicModel("ConnectX-5", False, MLX5),
    "1018": NicModel("ConnectX-5 VF", True, MLX5),
    "1019": NicModel("ConnectX-5 Ex", False, MLX5),
    "101a": NicModel("ConnectX-5 Ex VF", True, MLX5),
    "101b": NicModel("ConnectX-6", False, MLX5),
    "101c": NicModel("ConnectX-6 VF", True, MLX5),
    "101d": NicModel("ConnectX-6 Dx", False, MLX5),
    "101e": NicModel("ConnectX mlx5Gen VF", True, MLX5),
    "101f": NicModel("ConnectX-6 Lx", False, MLX5),
    "1021": NicModel("ConnectX-7", False, MLX5),
    "1023": NicModel("ConnectX-8", False, MLX5),
    "1025": NicModel("ConnectX-9", False, MLX5),
    "a2d2": NicModel("BlueField (ConnectX-5)", False, MLX5),
    "a2d3": NicModel("BlueField (ConnectX-5) VF", True, MLX5),
    "a2d6": NicModel("BlueField-2 (ConnectX-6 Dx)", False, MLX5),
    "a2dc": NicModel("BlueField-3 (ConnectX-7)", False, MLX5),
    "a2df": NicModel("BlueField-4 (ConnectX-8)", False, MLX5),
}


def _hex4(value: Optional[str]) -> str:
    """``0x15B3`` / ``15b3`` -> ``15b3``; "" for None."""
    if not value:
        return ""
    text = value.strip().lower()
    return text.removeprefix("0x")


def lookup(vendor: Optional[str], device: Optional[str]) -> Optional[NicModel]:
    """The model of a PCI function from its sysfs ``vendor``/``device`` (``0x15b3``, ``0x101d``)."""
    if _hex4(vendor) != MELLANOX:
        return None
    return _MODELS.get(_hex4(device))


def pci_id(vendor: Optional[str], device: Optional[str]) -> str:
    """``15b3:101d``, as ``lspci -nn`` prints it (``?`` for what sysfs did not say)."""
    return f"{_hex4(vendor) or '?'}:{_hex4(device) or '?'}"


def describe(vendor: Optional[str], device: Optional[str], pf_model: Optional[NicModel] = None) -> str:
    """A human name: ``ConnectX-6 Dx``; a mlx5Gen VF as ``ConnectX mlx5Gen VF of ConnectX-6 Dx``
    when the PF is known; otherwise the vendor's name with ``unknown model``."""
    model = lookup(vendor, device)
    if model is not None:
        if _hex4(device) == "101e" and pf_model is not None and not pf_model.vf:
            return f"{model.name} of {pf_model.name}"
        return model.name
    return f"{VENDORS.get(_hex4(vendor), 'vendor ' + (_hex4(vendor) or '?'))} (unknown model)"


def is_mellanox(vendor: Optional[str]) -> bool:
    return _hex4(vendor) == MELLANOX


def is_network_class(pci_class: Optional[str]) -> bool:
    """PCI base class 0x02 (network controller)."""
    return _hex4(pci_class).startswith("02")
