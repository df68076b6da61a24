"""Judging InfiniBand (area ``ib``): which plugin fits each RDMA port, the IPoIB netdevs with
their pkey and mode, ib_ipoib, subnet-manager state, and IB VFs without a GUID. Pure, like
``host_checks``.

Facts relied on (the kernel's drivers/infiniband/ulp/ipoib/ and drivers/infiniband/core/sysfs.c;
ib-sriov-cni's pkg/sriov):

- A port's link layer decides the shared-mode plugin: Ethernet (RoCE) → macvlan-rdma on its
  netdev; InfiniBand → ipoib-rdma on its IPoIB netdev (a macvlan cannot hang off an IPoIB port).
  Exclusive mode takes VFs (host-device-rdma) either way.
- ib_ipoib creates the IPoIB netdev (ARPHRD 32) of every IB port; without it an IB port has no
  netdev and ipoib-rdma has no master.
- A port in state INIT has a physical link but no subnet manager configured it: IPoIB children
  get no carrier and RDMA connections fail until an SM (opensm, UFM) runs.
- A never-initialised mlx5 IB VF has node GUID 0: RDMA in a pod fails until one is set
  (ib-sriov-cni refuses such a VF: "GUID is not valid"); host-device-rdma sets one at ADD.
"""

from __future__ import annotations

from rdmanet.cni.core.infiniband import pkey_text

from .findings import Finding, info, ok, warn
from .host_facts import HostFacts, RdmaDevice

ARPHRD_INFINIBAND = 32
SM_FIX = "the port has a link but no subnet manager configured it: run opensm on the fabric (or check UFM)"


def _state(text) -> str:
    if not text:
        return "?"
    return text.split(":", 1)[1].strip() if ":" in text else text.strip()


def _ipoib_netdevs(dev: RdmaDevice, facts: HostFacts) -> list[str]:
    return [n for n in dev.netdevs if (nd := facts.netdevs.get(n)) is not None and nd.link_type == ARPHRD_INFINIBAND]


def _ipoib_text(name: str, facts: HostFacts) -> str:
    nd = facts.netdevs[name]
    details = [pkey_text(nd.pkey) if nd.pkey is not None else "pkey ?", nd.ipoib_mode or "mode ?"]
    if nd.mtu:
        details.append(f"MTU {nd.mtu}")
    return f"{name} ({', '.join(details)})"


def check_infiniband(facts: HostFacts) -> list[Finding]:
    out: list[Finding] = []
    ib_ports = 0
    for dev in facts.rdma.values():
        if _is_vf(dev, facts):
            continue  # VFs serve exclusive mode; their GUIDs are judged below
        for port in dev.ports:
            subject = f"{dev.name}/{port.number}"
            state = f"{_state(port.state)} ({_state(port.phys_state)})"
            if port.link_layer == "InfiniBand":
                ib_ports += 1
                ipoib = _ipoib_netdevs(dev, facts)
                if not ipoib:
                    loaded = facts.modules.state.get("ib_ipoib") if facts.modules.source else "?"
                    fix = ("modprobe ib_ipoib (and list it in /etc/modules-load.d/)" if loaded is None
                           else "check the HCA driver's log (dmesg): ib_ipoib creates one netdev per IB port")
                    out.append(warn("ib", subject, f"InfiniBand port, {state}, without an IPoIB netdev"
                                    + (": ib_ipoib is not loaded" if loaded is None else "")
                                    + ": ipoib-rdma has no master here", fix))
                    continue
                text = (f"InfiniBand port, {state}, IPoIB {', '.join(_ipoib_text(n, facts) for n in ipoib)}: shared pods take "
                        f"ipoib-rdma (\"master\": \"{ipoib[0]}\"), exclusive pods its VFs with host-device-rdma; "
                        "macvlan-rdma cannot use an IPoIB port")
                if _state(port.state) == "INIT":
                    out.append(warn("ib", subject, text + "; the port is INIT: IPoIB children get no carrier", SM_FIX))
                else:
                    out.append(ok("ib", subject, text))
            elif port.link_layer == "Ethernet" and dev.netdevs:
                out.append(info("ib", subject, f"RoCE port (link layer Ethernet), netdev {dev.netdevs[0]}: shared pods take "
                                               f"macvlan-rdma (\"master\": \"{dev.netdevs[0]}\"); ipoib-rdma does not apply"))
    for fn in facts.pci.values():
        if fn.physfn is None:
            continue
        for name in fn.rdma:
            dev = facts.rdma.get(name)
            if dev is None or dev.node_guid != 0 or not any(p.link_layer == "InfiniBand" for p in dev.ports):
                continue
            out.append(info("ib", fn.address, f"IB VF {fn.address} ({name}) has node GUID 0000:0000:0000:0000: RDMA in a pod "
                                              "fails until a GUID is set (ib-sriov-cni refuses it: \"GUID is not valid\")",
                            "host-device-rdma sets one at ADD: the pod's infiniband-guid (capability infinibandGUID), the "
                            "config's guid, or one derived from the attachment"))
    if ib_ports and facts.modules.source:
        if facts.modules.state.get("ib_ipoib"):
            out.append(ok("ib", "ib_ipoib", "loaded: IPoIB netdevs for the InfiniBand ports (ipoib-rdma's masters)"))
        else:
            out.append(warn("ib", "ib_ipoib", "not loaded while the host has InfiniBand ports: no IPoIB netdevs, ipoib-rdma "
                                              "cannot attach pods", "modprobe ib_ipoib"))
    return out


def _is_vf(dev: RdmaDevice, facts: HostFacts) -> bool:
    fn = facts.pci.get(dev.parent_id or "")
    return fn is not None and fn.physfn is not None
