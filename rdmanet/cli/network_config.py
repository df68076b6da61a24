"""``--network-config FILE``: the network configs a file holds, as an operator has them.

One loader for every command that takes the option (``rdmanet doctor``, ``rdmanet ipam ls``,
``ipam reconcile``, ``ipam plan``). The file may be:

- a NetworkAttachmentDefinition in YAML or JSON (its ``spec.config``, a JSON string or an
  object; the network is named after ``metadata.name`` when the config names none, as Multus
  does), or several of them and other objects in one YAML stream (``---``): a file of
  ``deploy/examples/`` as it is, where the Pod beside the NAD is passed over;
- a ``.conflist`` (``plugins``) or a single plugin config (``type``), as in a CNI conf dir;
- a ``kind: List`` (``kubectl get net-attach-def -o yaml``) of any of these.

JSON is read as JSON first (PyYAML reads YAML 1.1, of which JSON is not quite a subset); any
other text as a YAML stream.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from rdmanet.cni.core.errors import INVALID_CONFIG, IO_FAILURE, CNIError

NAD_KIND = "NetworkAttachmentDefinition"
MAX_BYTES = 16 << 20
FORMS = "a NetworkAttachmentDefinition (YAML or JSON), a .conflist or a network config"


@dataclass(frozen=True)
class NetworkDoc:
    """One network of the file: ``config`` is a netconf or a conflist, ``source`` says where it
    is (the file, and the NAD's name or the document's number)."""

    source: str
    config: dict

    @property
    def name(self) -> str:
        name = self.config.get("name")
        return name if isinstance(name, str) else ""


def read_documents(path: str) -> list[Any]:
    """The documents of ``path`` (JSON: one; YAML: every document of the stream, empty ones left out)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise CNIError(IO_FAILURE, f"cannot read {path}: {exc.strerror or exc}", "give a readable network config file") from None
    if len(data) > MAX_BYTES:
        raise CNIError(INVALID_CONFIG, f"{path} is larger than {MAX_BYTES >> 20} MiB", f"give {FORMS}")
    text = data.decode("utf-8", "replace")
    if text.lstrip().startswith(("{", "[")):
        try:
            return [json.loads(text)]
        except ValueError:
            pass  # YAML flow style, or broken JSON: the YAML parser says where
    import yaml

    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1}, column {where.column + 1})" if where is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise CNIError(INVALID_CONFIG, f"{path} is neither JSON nor YAML{line}: {problem}", f"give {FORMS}") from None


def _nad_config(doc: dict, where: str) -> dict:
    raw = doc["spec"]["config"]
    try:
        config = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError as exc:
        raise CNIError(INVALID_CONFIG, f"{where}: spec.config is not JSON: {exc}",
                       "spec.config holds the network config as a JSON string (config: | then the JSON)") from None
    if not isinstance(config, dict):
        raise CNIError(INVALID_CONFIG, f"{where}: spec.config is not a JSON object", "give the network config as a JSON object")
    name = (doc.get("metadata") or {}).get("name")
    if not config.get("name") and isinstance(name, str) and name:
        config = dict(config, name=name)  # Multus names the network after the NAD
    return config


def _networks(doc: Any, path: str, index: int, many: bool) -> Iterator[NetworkDoc]:
    if not isinstance(doc, dict):
        return
    if doc.get("kind") == "List" and isinstance(doc.get("items"), list):
        for i, item in enumerate(doc["items"]):
            yield from _networks(item, path, i, True)
        return
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    if isinstance(doc.get("spec"), dict) and "config" in doc["spec"]:
        label = "/".join(x for x in (meta.get("namespace"), meta.get("name")) if isinstance(x, str) and x)
        where = f"{path} ({doc.get('kind') or NAD_KIND} {label})" if label else path
        yield NetworkDoc(where, _nad_config(doc, where))
    elif "kind" not in doc and ("type" in doc or isinstance(doc.get("plugins"), list)):
        yield NetworkDoc(f"{path} (document {index + 1})" if many else path, doc)


def load(path: str) -> list[NetworkDoc]:
    """Every network config ``path`` holds, in file order; CNI error 7 when it holds none."""
    docs = read_documents(path)
    found = [net for i, doc in enumerate(docs) for net in _networks(doc, path, i, len(docs) > 1)]
    if not found:
        kinds = sorted({str(d.get("kind")) for d in docs if isinstance(d, dict) and d.get("kind")})
        seen = f" (it holds {', '.join(kinds)})" if kinds else ""
        raise CNIError(INVALID_CONFIG, f"{path} holds no network config{seen}", f"give {FORMS}")
    return found


def with_ipam(net: NetworkDoc) -> Optional[dict]:
    """The network's config as its IPAM sees it (the plugin of a conflist that has an ``ipam``
    block, with the list's name and cniVersion), or None when it has none."""
    doc = net.config
    if isinstance(doc.get("ipam"), dict):
        return doc
    for plugin in doc.get("plugins") or []:
        if isinstance(plugin, dict) and isinstance(plugin.get("ipam"), dict):
            return dict(plugin, name=doc.get("name", plugin.get("name", "")), cniVersion=doc.get("cniVersion", ""))
    return None


def ipam_configs(path: str, network: Optional[str] = None) -> list[dict]:
    """The configs with an ``ipam`` block that ``path`` holds (only the network ``network``, when
    given); CNI error 7 when there is none."""
    nets = load(path)
    configs = [c for c in (with_ipam(n) for n in nets) if c is not None]
    if network is not None:
        configs = [c for c in configs if c.get("name") == network]
        if not configs:
            names = ", ".join(n.name or "?" for n in nets)
            raise CNIError(INVALID_CONFIG, f"{path} has no network named {network} with an ipam block (it has {names})",
                           "give --network one of those names")
    if not configs:
        raise CNIError(INVALID_CONFIG, f"{path}: no network config of it has an ipam block",
                       'add "ipam": {"type": "lease-ipam", "range": "10.1.1.0/24"} to the plugin')
    return configs


def one_ipam_config(path: str, network: Optional[str] = None) -> dict:
    """The one config with an ``ipam`` block of ``path`` (``network`` picks one of several)."""
    configs = ipam_configs(path, network)
    if len(configs) > 1:
        names = ", ".join(str(c.get("name") or "?") for c in configs)
        raise CNIError(INVALID_CONFIG, f"{path} holds {len(configs)} networks with an ipam block ({names})",
                       "pick one with --network NAME")
    return configs[0]
