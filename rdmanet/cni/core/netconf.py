"""The network configuration fields every plugin shares, and pydantic errors turned into CNI errors.

Models are strict (JSON types, no "1500" for 1500) and tolerate unknown keys: runtimes and
Multus add keys of their own (``deviceID``, ``pciBusID``, ``cni.dev/*``, ``args``). Any other
top-level key an interface plugin does not read is most likely a typo (``"mastr"``): it is
logged as a warning naming the closest key the plugin knows (:func:`unknown_keys`), on the
``rdmanet.node`` logger the daemon always writes, and ``rdmanet doctor`` flags it.
Each field's ``description`` is the fix a user reads when the field is wrong.
"""

from __future__ import annotations

import difflib
import logging
import os
from typing import Any, Optional, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import INVALID_CONFIG, CNIError

M = TypeVar("M", bound=BaseModel)

# Before it builds a validator, pydantic loads the plugins installed distributions declare (entry
# points of group "pydantic"). A plugin runs as root and uses none: pydantic's own switch turns
# them off (read at each lookup; an operator's value is kept).
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")


class Model(BaseModel):
    # defer_build: a model's validator is built when it first validates, not when its module is
    # imported. A call validates one plugin's config (and its ipam block): the base classes and
    # the nested models are built once, inside the model that validates, not each on its own too.
    model_config = ConfigDict(strict=True, extra="allow", populate_by_name=True, frozen=False, defer_build=True)


class IPAMRef(Model):
    type: str = Field(min_length=1, description='name the IPAM plugin binary, e.g. "ipam": {"type": "lease-ipam", ...}')


class RuntimeConfig(Model):
    mac: Optional[str] = Field(None, description='runtimeConfig.mac is a MAC address such as "0a:58:0a:01:01:05"')
    ips: Optional[list[str]] = Field(None, description="runtimeConfig.ips is a list of addresses such as 10.1.1.5/24")
    deviceID: Optional[str] = Field(None, description="runtimeConfig.deviceID is a PCI address dddd:bb:dd.f or an auxiliary device name")
    CNIDeviceInfoFile: Optional[str] = Field(None, description="runtimeConfig.CNIDeviceInfoFile is the absolute path Multus gives")


class NetConf(Model):
    cniVersion: str = "0.1.0"
    name: str = Field(description='name the network, e.g. "name": "rdma-net" (letters, digits, _ . -)')
    type: str = Field(description='type is the plugin binary, e.g. "type": "macvlan-rdma"')
    ipam: Optional[IPAMRef] = Field(None, description='an object such as {"type": "lease-ipam", "range": "10.1.1.0/24"}')
    dns: Optional[dict[str, Any]] = Field(None, description='dns is an object such as {"nameservers": ["10.0.0.53"], "search": ["svc"]}')
    runtimeConfig: RuntimeConfig = Field(default_factory=RuntimeConfig, description="an object set by the runtime from capabilities")
    prevResult: Optional[dict[str, Any]] = Field(None, description="prevResult is the previous plugin's CNI result object, set by the runtime")


def _location(loc: tuple) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(loc))


def config_error(exc: ValidationError, model: type[BaseModel], prefix: str = "") -> CNIError:
    """Name every bad field and, for the first, the fix taken from its description."""
    errors = exc.errors(include_url=False)
    parts = []
    for err in errors:
        where = prefix + _location(err["loc"]) if err["loc"] else (prefix.rstrip(".") or "config")
        what = err["msg"]
        if err["type"] == "missing":
            what = "required field is missing"
        parts.append(f"{where}: {what}")
    fix = _fix_for(model, errors[0]["loc"]) if errors else ""
    return CNIError(INVALID_CONFIG, "invalid network config: " + "; ".join(parts), fix)


def _fix_for(model: type[BaseModel], loc: tuple) -> str:
    """Walk the model along the error location to the deepest field that documents its fix."""
    fix = ""
    current: Any = model
    for part in loc:
        if isinstance(part, int):  # a list index: the element has the same model
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            break
        info = fields[part]
        if info.description:
            fix = info.description
        current = _model_of(info.annotation)
    return fix


def _model_of(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_of(arg)
        if found is not None:
            return found
    return None


# Top-level keys that runtimes, libcni and Multus add to any plugin's config (the CNI spec and its
# conventions, https://www.cni.dev/docs/conventions/; Multus' device-ID injection into every
# plugin of a conflist): never a typo.
CONVENTIONAL_KEYS = frozenset(("capabilities", "args", "deviceID", "pciBusID", "cniVersions", "disableCheck",
                               "disableGC", "loadOnlyInlinedPlugins"))
_node_log = logging.getLogger("rdmanet.node")  # the daemon writes it whatever the call's log level


def unknown_keys(model: type[BaseModel], data: dict) -> list[tuple[str, Optional[str]]]:
    """(key, the closest key ``model`` reads or None) of each top-level key of ``data`` that
    neither ``model`` nor a runtime's conventions know."""
    fields = sorted(model.model_fields)
    found = []
    for key in data:
        if key in model.model_fields or key in CONVENTIONAL_KEYS or key.startswith("cni.dev/"):
            continue
        close = difflib.get_close_matches(key, fields, n=1, cutoff=0.6)
        found.append((key, close[0] if close else None))
    return found


def warn_unknown_keys(model: type[BaseModel], data: dict) -> None:
    for key, close in unknown_keys(model, data):
        hint = f"; did you mean {close!r}?" if close else ""
        _node_log.warning("network %r (%s): unknown key %r is ignored%s", data.get("name"), data.get("type"), key, hint)


def load(model: type[M], data: dict, prefix: str = "") -> M:
    try:
        conf = model.model_validate(data)
    except ValidationError as exc:
        raise config_error(exc, model, prefix) from None
    if not prefix and issubclass(model, NetConf):
        warn_unknown_keys(model, data)
    return conf
