"""The CNI install: the bin dir (our shims answer VERSION; Multus and reference plugins), the conf
dir (file order, Multus first, parse errors) and the networks that use our plugins (what their ADD
would do with RDMA on this host, judged with the plugins' own ``rdmanet.cni.core.rdma_policy``).

Gathering (``gather_*``: files, exec of the shims) is separate from judging (``check_*``: pure).

Facts relied on:

- libcni lists ``*.conf``, ``*.conflist`` and ``*.json`` of the conf dir in lexical order, and the
  container runtime (containerd, CRI-O) uses the first file that loads; other files are ignored.
  A ``.conf``/``.json`` file must be a single plugin config (a ``type``); a list of plugins in one
  needs the ``.conflist`` extension.
- Multus is the ``multus`` binary (thin plugin) or ``multus-shim`` (thick plugin, talking to the
  Multus daemon); it must be the config the runtime uses, or NetworkAttachmentDefinitions are
  never consulted. Its config may inline ``delegates`` (confs or conflists).
- A shim written by ``rdmanet.node.launcher.render_shim`` starts ``#!<python> -IS``, says
  ``# rdmanet CNI shim for <name> (daemon only; ...)`` or ``(falls back to <site dir>; ...)`` on
  line 2 and ends ``sys.exit(run(<name>, <site dir or None>, <socket>))``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Optional

from rdmanet.cni.core.errors import INVALID_CONFIG, CNIError
from rdmanet.cni.core.rdma_policy import (
    EXCLUSIVE,
    EXCLUSIVE_MODE_FIX,
    SHARED_MODE_FIX,
    decide_exclusive,
    decide_shared,
)

from .findings import Finding, error, info, ok, warn
from .host_facts import HostFacts

OUR_PLUGINS = ("macvlan-rdma", "host-device-rdma", "ipoib-rdma", "lease-ipam")
MULTUS = ("multus", "multus-shim")
REFERENCE = ("macvlan", "host-device", "host-local", "static", "dhcp", "bridge", "loopback", "portmap", "tuning",
             "sriov", "rdma", "ib-sriov", "ipoib", "whereabouts", "nv-ipam")
CONF_EXTENSIONS = (".conf", ".conflist", ".json")
RDMA_SETTINGS = ("auto", "required", "off")
_RUN_LINE = re.compile(r"^\s*sys\.exit\(run\((.*)\)\)\s*$")


# =========================================================================== bin dir


@dataclass
class ShimFacts:
    name: str
    path: str
    exists: bool = False
    executable: bool = False
    kind: str = ""  # "fallback", "daemon-only", "other" (not an rdmanet shim)
    interpreter: Optional[str] = None
    interpreter_ok: Optional[bool] = None
    site_dir: Optional[str] = None
    site_dir_ok: Optional[bool] = None
    socket: Optional[str] = None
    versions: Optional[list[str]] = None  # supportedVersions of the VERSION answer
    version_error: str = ""


@dataclass
class BinFacts:
    path: str
    exists: bool
    names: list[str] = field(default_factory=list)
    shims: dict[str, ShimFacts] = field(default_factory=dict)


def _read_head_tail(path: str) -> tuple[list[str], list[str]]:
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
    except OSError:
        return [], []
    text = data.decode("utf-8", errors="replace")
    lines = text.splitlines()
    return lines[:3], lines[-5:]


def parse_shim(shim: ShimFacts) -> None:
    """Fill interpreter, kind, site dir and socket from the file's text (no exec)."""
    head, tail = _read_head_tail(shim.path)
    if head and head[0].startswith("#!"):
        words = head[0][2:].split()
        shim.interpreter = words[0] if words else None
    second = head[1] if len(head) > 1 else ""
    if not second.startswith("# rdmanet CNI shim for"):
        shim.kind = "other"
        return
    shim.kind = "daemon-only" if "(daemon only" in second else "fallback"
    for line in reversed(tail):
        m = _RUN_LINE.match(line)
        if m:
            try:
                args = ast.literal_eval("(" + m.group(1) + ",)")
            except (ValueError, SyntaxError):
                break
            if len(args) >= 3:
                shim.site_dir, shim.socket = args[1], args[2]
                if shim.site_dir is None:
                    shim.kind = "daemon-only"
            break


def run_version(path: str, timeout: float) -> tuple[Optional[list[str]], str]:
    """Exec the plugin with only ``CNI_COMMAND=VERSION`` set (as ``env -i``): its supportedVersions,
    or None and why not."""
    try:
        proc = subprocess.run([path], env={"CNI_COMMAND": "VERSION"}, stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"did not answer CNI_COMMAND=VERSION within {timeout:g} s"
    except FileNotFoundError:
        return None, "cannot be executed: its interpreter (the #! line) does not exist"
    except OSError as exc:
        return None, f"cannot be executed: {exc.strerror or exc}"
    out = proc.stdout.decode("utf-8", errors="replace").strip()
    try:
        doc = json.loads(out)
    except ValueError:
        doc = None
    if proc.returncode == 0 and isinstance(doc, dict) and isinstance(doc.get("supportedVersions"), list):
        return [str(v) for v in doc["supportedVersions"]], ""
    said = out or proc.stderr.decode("utf-8", errors="replace").strip()
    said = said.splitlines()[-1] if said else "no output"
    if isinstance(doc, dict) and doc.get("msg"):
        said = str(doc["msg"])
    return None, f"answered CNI_COMMAND=VERSION with exit code {proc.returncode}: {said[:300]}"


def gather_bin_dir(path: str, timeout: float) -> BinFacts:
    facts = BinFacts(path, os.path.isdir(path))
    if facts.exists:
        try:
            facts.names = sorted(os.listdir(path))
        except OSError:
            facts.names = []
    for name in OUR_PLUGINS:
        shim = ShimFacts(name, os.path.join(path, name))
        facts.shims[name] = shim
        shim.exists = os.path.isfile(shim.path)
        if not shim.exists:
            continue
        shim.executable = os.access(shim.path, os.X_OK)
        parse_shim(shim)
        if shim.interpreter:
            shim.interpreter_ok = os.access(shim.interpreter, os.X_OK)
        if shim.kind == "fallback" and shim.site_dir:
            shim.site_dir_ok = os.path.isdir(shim.site_dir)
    runnable = [s for s in facts.shims.values() if s.executable]
    if runnable:  # the three execs at once: each is a Python start
        with ThreadPoolExecutor(max_workers=len(runnable)) as pool:
            for shim, (versions, why) in zip(runnable, pool.map(lambda s: run_version(s.path, timeout), runnable)):
                shim.versions, shim.version_error = versions, why
    return facts


def check_bin_dir(facts: BinFacts, daemon_socket: str) -> list[Finding]:
    out: list[Finding] = []
    if not facts.exists:
        return [error("cni-bin", facts.path, "the CNI bin dir does not exist: no plugin can run",
                      "install rdmanet (install.sh) or give the runtime's bin dir with --cni-bin-dir")]
    for shim in facts.shims.values():
        if not shim.exists:
            out.append(error("cni-bin", shim.name, f"{shim.path} is missing: networks of type {shim.name} fail",
                             "run install.sh (it writes macvlan-rdma, host-device-rdma, ipoib-rdma and lease-ipam)"))
            continue
        if not shim.executable:
            out.append(error("cni-bin", shim.name, f"{shim.path} is not executable", f"chmod 0755 {shim.path}"))
            continue
        if shim.interpreter and shim.interpreter_ok is False:
            out.append(error("cni-bin", shim.name, f"{shim.path} names the interpreter {shim.interpreter}, which does not exist",
                             "re-run install.sh so the shim names an existing Python"))
            continue
        if shim.site_dir_ok is False:
            out.append(error("cni-bin", shim.name, f"{shim.path} runs plugins from {shim.site_dir}, which does not exist",
                             "re-run install.sh (the virtualenv moved or was removed)"))
            continue
        if shim.versions is None:
            out.append(error("cni-bin", shim.name, f"{shim.path} {shim.version_error}",
                             f"run 'env -i CNI_COMMAND=VERSION {shim.path}' to see the failure; re-run install.sh"))
            continue
        kind = {"daemon-only": "daemon-only shim", "fallback": "shim with in-process fallback"}.get(shim.kind, "executable")
        out.append(ok("cni-bin", shim.name, f"{kind}, answers VERSION: {' '.join(shim.versions)}"))
        if shim.socket and os.path.normpath(shim.socket) != os.path.normpath(daemon_socket):
            out.append(warn("cni-bin", shim.name, f"talks to the daemon at {shim.socket}, but doctor checked {daemon_socket}",
                            f"run doctor with --socket {shim.socket}, or re-run install.sh with the socket the daemon uses"))
    present = set(facts.names)
    multus = [m for m in MULTUS if m in present]
    if multus:
        out.append(ok("cni-bin", "multus", f"{' and '.join(multus)} present ({'thick' if 'multus-shim' in multus else 'thin'} plugin)"))
    else:
        out.append(info("cni-bin", "multus", "no multus or multus-shim binary: Kubernetes NetworkAttachmentDefinitions "
                        "need Multus; cnitool and podman work without it",
                        "install Multus (its DaemonSet copies the binary here) if this is a Kubernetes node"))
    refs = [r for r in REFERENCE if r in present]
    out.append(info("cni-bin", "reference", ("present: " + " ".join(refs)) if refs else "no reference plugins (loopback, host-local, ...)",
                    "" if "loopback" in refs else "most runtimes need loopback: install the containernetworking plugins"))
    return out


# =========================================================================== conf dir


@dataclass
class NetworkUse:
    """One plugin config that uses our plugins (as the plugin, or lease-ipam as its ipam), or nv-ipam (whose
    NADs lease-ipam takes)."""

    source: str
    network: str
    plugin: str
    ipam: Optional[str]
    config: dict  # the plugin's config with the network's name and cniVersion


@dataclass
class ConfFile:
    name: str
    path: str
    error: str = ""  # why it does not load
    types: list[str] = field(default_factory=list)
    networks: list[NetworkUse] = field(default_factory=list)

    @property
    def is_multus(self) -> bool:
        return bool(self.types) and self.types[0] in MULTUS


@dataclass
class ConfFacts:
    path: str
    exists: bool
    files: list[ConfFile] = field(default_factory=list)
    error: str = ""


def plugin_configs(doc: Any, where: str) -> list[tuple[str, str, dict]]:
    """(source, network name, plugin config) of every plugin a document holds: a conf, a conflist, a
    NetworkAttachmentDefinition object (its spec.config) and the ``delegates`` of a Multus config."""
    if isinstance(doc, dict) and isinstance(doc.get("spec"), dict) and "config" in doc["spec"]:
        raw = doc["spec"]["config"]
        try:
            inner = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError as exc:
            raise ValueError(f"spec.config is not JSON: {exc}") from None
        name = (doc.get("metadata") or {}).get("name", "")
        if isinstance(inner, dict) and not inner.get("name") and name:
            inner = dict(inner, name=name)
        return plugin_configs(inner, where)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    out: list[tuple[str, str, dict]] = []
    name = doc.get("name") if isinstance(doc.get("name"), str) else ""
    if isinstance(doc.get("plugins"), list):
        for plugin in doc["plugins"]:
            if isinstance(plugin, dict):
                out.append((where, name, dict(plugin, name=name, cniVersion=doc.get("cniVersion", plugin.get("cniVersion", "")))))
        return out
    out.append((where, name, doc))
    if doc.get("type") in MULTUS and isinstance(doc.get("delegates"), list):
        for i, delegate in enumerate(doc["delegates"]):
            try:
                out += plugin_configs(delegate, f"{where} (delegate {i})")
            except ValueError:
                continue
    return out


def network_uses(doc: Any, where: str) -> tuple[list[str], list[NetworkUse]]:
    """(plugin types in order, the uses of our plugins) of one document; ValueError if unusable."""
    types, uses = [], []
    for source, name, conf in plugin_configs(doc, where):
        ptype = conf.get("type")
        if isinstance(ptype, str):
            types.append(ptype)
        ipam = conf.get("ipam") if isinstance(conf.get("ipam"), dict) else {}
        itype = ipam.get("type") if isinstance(ipam.get("type"), str) else None
        if ptype in OUR_PLUGINS or itype in ("lease-ipam", "nv-ipam"):  # nv-ipam: lease-ipam takes its NADs
            uses.append(NetworkUse(source, name or "?", str(ptype), itype, conf))
    return types, uses


def load_conf_file(path: str, name: Optional[str] = None) -> ConfFile:
    cf = ConfFile(name or os.path.basename(path), path)
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except OSError as exc:
        cf.error = f"cannot be read: {exc.strerror or exc}"
        return cf
    except ValueError as exc:
        cf.error = f"is not valid JSON: {exc}"
        return cf
    try:
        cf.types, cf.networks = network_uses(doc, path)
    except ValueError as exc:
        cf.error = str(exc)
        return cf
    single = not path.endswith(".conflist")
    if single and isinstance(doc, dict) and "plugins" in doc and "type" not in doc and "spec" not in doc:
        cf.error = "holds a plugin list (\"plugins\") but is not named *.conflist: the runtime cannot load it"
    elif not cf.types:
        cf.error = "names no plugin type"
    return cf


def given_network_uses(path: str) -> list[NetworkUse]:
    """The uses of our plugins in a file given with ``--network-config``: a NAD in YAML or JSON
    (one or many documents), a conflist or a plugin config (:mod:`rdmanet.cli.network_config`);
    CNI error 7 (5: unreadable) naming the file when it holds no network config."""
    from ..network_config import load

    uses: list[NetworkUse] = []
    for net in load(path):
        try:
            uses += network_uses(net.config, net.source)[1]
        except ValueError as exc:
            raise CNIError(INVALID_CONFIG, f"{net.source}: {exc}", "give a network config as a JSON object") from None
    return uses


def gather_conf_dir(path: str) -> ConfFacts:
    facts = ConfFacts(path, os.path.isdir(path))
    if not facts.exists:
        return facts
    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        facts.error = exc.strerror or str(exc)
        return facts
    for name in names:
        full = os.path.join(path, name)
        if name.endswith(CONF_EXTENSIONS) and os.path.isfile(full):
            facts.files.append(load_conf_file(full, name))
    return facts


def check_conf_dir(facts: ConfFacts, bin_names: list[str]) -> list[Finding]:
    if not facts.exists:
        return [warn("cni-conf", facts.path, "the CNI conf dir does not exist: the runtime has no network config",
                     "install the cluster network (and Multus), or give the runtime's conf dir with --cni-conf-dir")]
    if facts.error:
        return [error("cni-conf", facts.path, f"cannot be listed: {facts.error}", "run doctor as root")]
    if not facts.files:
        return [warn("cni-conf", facts.path, "no *.conf, *.conflist or *.json: the runtime has no network config",
                     "install the cluster network (and Multus) so it writes its config here")]
    out: list[Finding] = []
    loadable = [f for f in facts.files if not f.error]
    for f in facts.files:
        if f.error:
            out.append(warn("cni-conf", f.name, f"{f.path} {f.error}; the runtime skips it",
                            "fix or remove the file"))
    order = " ".join(f.name for f in facts.files)
    if not loadable:
        out.append(error("cni-conf", facts.path, f"no file loads ({order}): the runtime has no network config",
                         "fix the files above"))
        return out
    first = loadable[0]
    out.insert(0, info("cni-conf", first.name, f"the runtime uses {first.name} ({' -> '.join(first.types)}); "
                                                f"files in lexical order: {order}"))
    multus = [f for f in loadable if f.is_multus]
    if first.is_multus:
        out.append(ok("cni-conf", first.name, f"Multus ({first.types[0]}) is the config the runtime uses"))
    elif multus:
        out.append(error("cni-conf", multus[0].name,
                         f"Multus's config {multus[0].name} is not first: the runtime uses {first.name}, so pods get "
                         "no secondary networks (NetworkAttachmentDefinitions are ignored)",
                         f"make Multus's file sort first (e.g. rename it to 00-multus.conf) or move {first.name} away"))
    elif any(m in bin_names for m in MULTUS):
        out.append(warn("cni-conf", facts.path, "the multus binary is installed but no Multus config is here",
                        "check the Multus DaemonSet (it writes 00-multus.conf) and its --cni-conf-dir"))
    else:
        out.append(info("cni-conf", facts.path, "no Multus config: fine for cnitool/podman; Kubernetes "
                        "NetworkAttachmentDefinitions need Multus first in this dir"))
    return out


# =========================================================================== networks


@dataclass
class NetworkFacts:
    """What the host says about the devices one network config names (gathered by the caller)."""

    link: Optional[str] = None  # master (macvlan-rdma) or the device as named (host-device-rdma)
    link_exists: Optional[bool] = None
    rdma: Optional[list[str]] = None  # None: the device is not known before ADD (Multus passes it)


def _setting(conf: dict) -> str:
    value = conf.get("rdma", "auto")
    return value if isinstance(value, str) else repr(value)


def static_device(conf: dict) -> Optional[tuple[str, str]]:
    """The device a host-device-rdma config names itself: ("netdev", name) or ("id", pci/aux id).
    Multus adds ``deviceID``/``pciBusID`` only at ADD time, so a NAD usually names none."""
    for key in ("deviceID", "pciBusID"):
        if isinstance(conf.get(key), str) and conf[key]:
            return ("id", conf[key])
    runtime = conf.get("runtimeConfig")
    if isinstance(runtime, dict) and isinstance(runtime.get("deviceID"), str) and runtime["deviceID"]:
        return ("id", runtime["deviceID"])
    if isinstance(conf.get("device"), str) and conf["device"]:
        return ("netdev", conf["device"])
    return None


def masters_of(uses: list[NetworkUse]) -> tuple[str, ...]:
    """Netdevs the networks name (macvlan master, host-device device), for the host gathering."""
    out = []
    for use in uses:
        if use.plugin in ("macvlan-rdma", "ipoib-rdma") and isinstance(use.config.get("master"), str):
            out.append(use.config["master"])
        if use.plugin == "host-device-rdma":
            dev = static_device(use.config)
            if dev and dev[0] == "netdev":
                out.append(dev[1])
    return tuple(out)


def gather_network(use: NetworkUse, host: HostFacts, sysfs_root: str) -> NetworkFacts:
    from rdmanet.cni.linux import sysfs

    if use.plugin in ("macvlan-rdma", "ipoib-rdma"):
        if use.config.get("linkInContainer") is True:
            return NetworkFacts()
        default = host.default_route if use.plugin == "macvlan-rdma" else None  # ipoib-rdma: master is required
        master = use.config.get("master") if isinstance(use.config.get("master"), str) else default
        if not master:
            return NetworkFacts()
        dev = host.netdevs.get(master)
        exists = dev.exists if dev else sysfs.read_attribute(f"/sys/class/net/{master}/mtu", sysfs_root) is not None
        return NetworkFacts(master, exists, dev.rdma if dev and dev.exists else [])
    if use.plugin == "host-device-rdma":
        dev = static_device(use.config)
        if dev is None:
            return NetworkFacts()
        if dev[0] == "netdev":
            nd = host.netdevs.get(dev[1])
            return NetworkFacts(dev[1], bool(nd and nd.exists), nd.rdma if nd and nd.exists else [])
        try:
            kind = "pci" if sysfs.is_pci_address(dev[1]) else "auxiliary"
            return NetworkFacts(dev[1], sysfs.device_exists(kind, dev[1], sysfs_root),
                                sysfs.rdma_devices_for_device_id(dev[1], sysfs_root))
        except ValueError:
            return NetworkFacts(dev[1], False, [])
    return NetworkFacts()


def _plugin_finding(use: NetworkUse, facts: NetworkFacts, host: HostFacts) -> Finding:
    subject = use.network
    where = f"{use.plugin} in {use.source}"
    setting = _setting(use.config)
    if setting not in RDMA_SETTINGS:
        return error("network", subject, f"{where}: rdma is {setting}: ADD fails (invalid config)",
                     'set "rdma" to "auto", "required" or "off"')
    mode = host.mode.mode if host.mode.status == "ok" else None
    if (wrong := _wrong_port(use, facts, host)) is not None:
        return wrong
    if use.plugin in ("macvlan-rdma", "ipoib-rdma"):
        child = "a macvlan" if use.plugin == "macvlan-rdma" else "an IPoIB child"  # what a pod gets
        if facts.link is None:
            return info("network", subject, f"{where}: master is in the pod or not known here (no default route): "
                                            "RDMA not judged")
        if facts.link_exists is False:
            return error("network", subject, f"{where}: master {facts.link} does not exist on this host: ADD fails",
                         'set "master" to a port of the RDMA NIC (see the link and rdma rows above)')
        devices = facts.rdma or []
        asked = mode if devices or setting == "required" else None
        try:
            decision = decide_shared(setting, facts.link, devices, asked)
        except CNIError as err:
            return error("network", subject, f"{where}: ADD fails: {err.msg}", err.details)
        if decision.warning:
            fix = SHARED_MODE_FIX if asked == EXCLUSIVE else "use a master port with exactly one RDMA device"
            return warn("network", subject, f"{where}: pods attach without RDMA: {decision.warning}", fix)
        if decision.device:
            return ok("network", subject, f"{where}: pods get {child} on {facts.link} and use its RDMA device "
                                          f"{decision.device} (shared mode)")
        plain = "a plain macvlan" if use.plugin == "macvlan-rdma" else "an IPoIB child without RDMA"
        if setting == "off":
            return info("network", subject, f"{where}: rdma is off: {plain} on {facts.link}")
        return info("network", subject, f"{where}: master {facts.link} has no RDMA device: pods get {plain}",
                    'pick a port of an RDMA NIC as "master" for RDMA pods')
    # host-device-rdma
    if setting == "off":
        return info("network", subject, f"{where}: rdma is off: the netdev moves, no RDMA device does")
    if facts.link is not None:
        if facts.link_exists is False:
            return error("network", subject, f"{where}: device {facts.link} does not exist on this host: ADD fails",
                         "fix the device in the config (or let Multus pass the device plugin's deviceID)")
        devices = facts.rdma or []
        asked = mode if devices or setting == "required" else None
        try:
            moved = decide_exclusive(setting, facts.link, devices, asked)
        except CNIError as err:
            return error("network", subject, f"{where}: ADD fails: {err.msg}", err.details)
        if moved:
            return ok("network", subject, f"{where}: {facts.link} and its RDMA device {moved} move into the pod")
        if not devices:
            return info("network", subject, f"{where}: {facts.link} has no RDMA device: only the netdev moves")
        return info("network", subject, f"{where}: only the netdev of {facts.link} moves; {devices[0]} stays in the "
                                        f"host netns ({mode or 'no'} RDMA netns mode)",
                    f"to move RDMA devices with their netdevs: {EXCLUSIVE_MODE_FIX}")
    # the device comes from Multus at ADD time
    if setting == "required" and mode != EXCLUSIVE:
        found = mode or "unknown (no RDMA netlink)"
        return error("network", subject, f"{where}: rdma is \"required\" but the RDMA netns mode is {found}: "
                                          "every ADD fails", EXCLUSIVE_MODE_FIX)
    if mode == EXCLUSIVE:
        return ok("network", subject, f"{where}: the device Multus passes (deviceID) moves into the pod with its RDMA device")
    return info("network", subject, f"{where}: the device Multus passes moves without its RDMA device "
                                    f"({mode or 'no'} RDMA netns mode)",
                f"for per-pod RDMA devices: {EXCLUSIVE_MODE_FIX}")


def _wrong_port(use: NetworkUse, facts: NetworkFacts, host: HostFacts) -> Optional[Finding]:
    """A macvlan-rdma master that is an IPoIB netdev, or an ipoib-rdma master that is not: ADD
    fails, and the other plugin is the one for that port."""
    if use.plugin not in ("macvlan-rdma", "ipoib-rdma") or not facts.link or not facts.link_exists:
        return None
    dev = host.netdevs.get(facts.link)
    link_type = dev.link_type if dev is not None else None
    where = f"{use.plugin} in {use.source}"
    if use.plugin == "macvlan-rdma" and link_type == 32:
        return error("network", use.network, f"{where}: master {facts.link} is an IPoIB (InfiniBand) netdev: a macvlan "
                                             "cannot hang off it: ADD fails", '"type": "ipoib-rdma" is the plugin for IB ports')
    if use.plugin == "ipoib-rdma" and link_type is not None and link_type != 32:
        return error("network", use.network, f"{where}: master {facts.link} is not an IPoIB netdev (link type {link_type}): "
                                             "ADD fails", '"type": "macvlan-rdma" is the plugin for Ethernet and RoCE ports')
    return None


def check_networks(uses: list[NetworkUse], facts: list[NetworkFacts], host: HostFacts, bin_names: list[str],
                   bin_dir: str) -> list[Finding]:
    out: list[Finding] = []
    present = set(bin_names)
    for use, nf in zip(uses, facts):
        if use.plugin in ("macvlan-rdma", "host-device-rdma", "ipoib-rdma"):
            out.append(_plugin_finding(use, nf, host))
        elif use.plugin != "lease-ipam":
            out.append(info("network", use.network, f"{use.plugin} in {use.source} uses {use.ipam}"))
        for needed in (use.plugin, use.ipam):
            if needed and needed not in present and needed not in OUR_PLUGINS:
                out.append(error("network", use.network, f"{use.source} needs the plugin {needed}, which is not in {bin_dir}: ADD fails",
                                 f"install {needed} into {bin_dir}"))
    return out
