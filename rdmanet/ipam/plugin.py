"""lease-ipam: the CNI verbs on top of the config, the requested-address rules and a store.

Facts relied on (the CNI spec, containernetworking/cni SPEC.md; the IPAM plugins of
containernetworking/plugins):
- An IPAM plugin answers ADD with the abbreviated result: ``ips`` (with gateway, no
  ``interface``), ``routes`` and ``dns``, rendered in the config's cniVersion (skel does that).
- DEL is keyed by (CNI_CONTAINERID, CNI_IFNAME), must succeed when nothing is reserved and on
  repeats, and must work when the netns is gone (we never look at it).
- CHECK must fail when a reservation is missing; prevResult, when given, must list our addresses.
- GC's stdin carries ``cni.dev/valid-attachments`` [{containerID, ifname}] (libcni also sends the
  legacy ``cni.dev/attachments``). STATUS answers 50 when ADD could not succeed.
- The store: the Kubernetes Lease store (store/kube.py) when the ipam block has a ``kubernetes``
  key, else the local file store. The ``kubernetes`` client is imported only in the first case.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

from rdmanet.cni.core.errors import CHECK_FAILED, IO_FAILURE, NOT_AVAILABLE, TRY_AGAIN_LATER, CNIError
from rdmanet.cni.core.gc import VALID_KEY
from rdmanet.cni.core.gc import valid_attachments as core_valid_attachments
from rdmanet.cni.core.invocation import Invocation
from rdmanet.cni.core import log_levels
from rdmanet.cni.core.result import IPConfig, Result
from rdmanet.cni.linux import roots

from .location import KUBERNETES, config_path, from_kubernetes, ipam_block, no_cluster_store, store_kind, store_location
from .requested import assign, requested_addresses
from .store.base import Attachment, Store

if TYPE_CHECKING:
    from .config import LeaseIPAMConfig

log = logging.getLogger("rdmanet.ipam")

# whereabouts' log levels, mapped onto logging's.
_LEVELS = {"debug": logging.DEBUG, "verbose": logging.INFO, "info": logging.INFO, "error": logging.ERROR,
           "panic": logging.CRITICAL}
_file_handlers: dict[str, logging.Handler] = {}
_file_handlers_lock = threading.Lock()
MAX_LOG_FILES = 64  # distinct ipam.log_file paths one process keeps open (the daemon must not grow)
DATA_DIR_KEY = "ipam.dataDir"

StoreFactory = Callable[[str, str, Invocation], Store]


def local_store(data_dir: str, domain: str, inv: Invocation) -> Store:
    """The file store in ``<dataDir>/<domain>``: dataDir must lie under the node's data roots
    (default /var/lib/cni), every existing directory on the way private and no symlink."""
    roots.check_dir("data", DATA_DIR_KEY, os.path.join(data_dir, domain))  # dataDir passed location.config_path
    from .store.local import LocalStore  # here: the Kubernetes store's calls do not need it

    return LocalStore(data_dir, domain)


def kube_store(data_dir: str, domain: str, inv: Invocation) -> Store:
    from .kube_config import kube_settings
    from .node_gc import remember
    from .store.kube import KubeStore

    settings = kube_settings(inv.config)
    remember(settings)  # the daemon's node GC reconciles this node's claims in every store it served
    return KubeStore.for_invocation(settings, domain, inv)


def default_store(data_dir: str, domain: str, inv: Invocation) -> Store:
    """The store the ipam block (whereabouts' flat file merged) selects (:mod:`rdmanet.ipam.location`).

    Neither chosen: the local store, except for a call for a Kubernetes pod, where a per-node store
    would hand the same address to pods on two nodes: ADD, CHECK and STATUS are refused (code 7)
    and DEL and GC only clean this node's local store (a DEL never fails for a missing store)."""
    kind = store_kind(ipam_block(inv.config))
    if kind == KUBERNETES:
        return kube_store(data_dir, domain, inv)
    if kind is None and from_kubernetes(inv.args) and inv.command not in ("DEL", "GC"):
        raise no_cluster_store(inv.network_name)
    return local_store(data_dir, domain, inv)


@contextlib.contextmanager
def call_logging(config: dict) -> Iterator[None]:
    """Honour ``ipam.log_file``/``ipam.log_level`` for this call only (read leniently: logging
    must never fail a verb). The node daemon serves many networks at once, so the settings live
    in a context variable that filters records (:class:`_CallLevel`, the file handlers' filter);
    this logger's level is lowered only while a call with a ``log_level`` runs (:data:`_ipam_level`).

    ``log_file`` must lie under the node's log roots (default /var/log/rdmanet): whereabouts NADs
    commonly say ``/tmp/whereabouts.log``, so a path outside is ignored with a warning (on the
    daemon's own log, rdmanet.cni.linux.roots.node_log), never written, and never fails the call. The file
    is created 0600 without following a symlink; at most :data:`MAX_LOG_FILES` are kept open."""
    try:
        raw = ipam_block(config)
    except CNIError:
        raw = config.get("ipam") if isinstance(config.get("ipam"), dict) else {}
    level = raw.get("log_level")
    level = _LEVELS.get(level.lower()) if isinstance(level, str) else None
    path = raw.get("log_file") if isinstance(raw.get("log_file"), str) and raw.get("log_file") else None
    if path is not None:
        path = _open_log_file(path)
    token = _call_logging.set((level, path))
    try:
        with _ipam_level.hold(None if level is None else logging.DEBUG):
            yield
    finally:
        _call_logging.reset(token)


def _logged(verb: Callable[["LeaseIPAM", Invocation], Any]) -> Callable[["LeaseIPAM", Invocation], Any]:
    """A verb run inside :func:`call_logging` of its config."""

    @functools.wraps(verb)
    def run(self: "LeaseIPAM", inv: Invocation) -> Any:
        with call_logging(inv.config):
            return verb(self, inv)

    return run


def _open_log_file(path: str) -> Optional[str]:
    """Open ``path`` for this process's handlers; None (and a warning) when it is not allowed."""
    try:
        config_path(path, "ipam.log_file", "/var/log/rdmanet/lease-ipam.log")
    except CNIError as exc:
        roots.node_log.warning("ipam.log_file %s ignored: %s", path, exc.msg)
        return None
    with _file_handlers_lock:
        if path in _file_handlers:
            return path
        if len(_file_handlers) >= MAX_LOG_FILES:
            roots.node_log.warning("ipam.log_file %s ignored: %d log files are open already", path, MAX_LOG_FILES)
            return None
        try:
            fd = roots.open_file("log", "ipam.log_file", path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode=0o600,
                                 create_dirs=True)
        except CNIError as exc:
            roots.node_log.warning("ipam.log_file %s ignored: %s (%s)", path, exc.msg, exc.details)
            return None
        except OSError as exc:
            roots.node_log.warning("ipam.log_file %s ignored: %s", path, exc)
            return None
        handler = logging.StreamHandler(os.fdopen(fd, "a", encoding="utf-8", errors="replace", buffering=1))
        handler.setFormatter(logging.Formatter("%(asctime)s lease-ipam[%(process)d] %(levelname)s %(message)s"))
        handler.addFilter(lambda record, path=path: _call_logging.get()[1] == path)
        _file_handlers[path] = handler
        log.addHandler(handler)
        return path


class _CallLevel(logging.Filter):
    """Drop records below the current call's ``log_level``; without one, below the level the
    parent "rdmanet" logger has (RDMANET_LOG_LEVEL), as if this logger had no level of its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        level = _call_logging.get()[0]
        return record.levelno >= (level if level is not None else log.parent.getEffectiveLevel())


_call_logging: ContextVar[tuple[Optional[int], Optional[str]]] = ContextVar("lease_ipam_logging", default=(None, None))
log.addFilter(_CallLevel())
# While a call with a log_level runs, every record of this logger is made (its parent's level
# may be higher, e.g. the daemon's WARNING) and _CallLevel keeps each call's own.
_ipam_level = log_levels.LevelGate(log, logging.NOTSET)


def render(config: "LeaseIPAMConfig", addresses: list) -> Result:
    ips = []
    for rs, ip in zip(config.range_sets, addresses):
        r = rs.range_of(ip)
        ips.append(IPConfig(address=r.interface(ip), gateway=r.gateway))
    return Result(ips=ips + list(config.static), routes=list(config.routes), dns=config.dns)


def valid_attachments(config: dict) -> Optional[set[Attachment]]:
    """The GC keep-list as attachments, or None when the config carries neither key."""
    valid = core_valid_attachments(config)
    return None if valid is None else {Attachment(cid, ifname) for cid, ifname in valid}


def parse_ipam_config(config: dict) -> "LeaseIPAMConfig":
    """Imported on use: pydantic costs ~80 ms per exec, and DEL and GC do not need it."""
    from .config import parse_ipam_config as parse

    return parse(config)


class LeaseIPAM:
    def __init__(self, store_factory: Optional[StoreFactory] = None) -> None:
        self._store_factory = store_factory or default_store

    def _store(self, inv: Invocation) -> Store:
        data_dir, domain = store_location(inv.config)
        return self._store_factory(data_dir, domain, inv)

    def _configured(self, inv: Invocation) -> tuple["LeaseIPAMConfig", Store]:
        """The validated config and its store; a config naming nv-ipam's pools gets the range sets
        they give this node (read from the API: :mod:`rdmanet.ipam.pool_ranges`)."""
        config = parse_ipam_config(inv.config)
        store = self._store(inv)
        if config.pools is not None:
            from .pool_ranges import resolve

            config = resolve(config, inv, store)
        return config, store

    @_logged
    def add(self, inv: Invocation) -> Result:
        config, store = self._configured(inv)
        requested = assign(config, requested_addresses(inv))
        attachment = Attachment(inv.container_id, inv.ifname)
        addresses = store.allocate(attachment, inv.network_name, config.range_sets, requested)
        log.info("ADD %s in %s: %s", attachment, config.domain, ", ".join(map(str, addresses)))
        return render(config, addresses)

    @_logged
    def delete(self, inv: Invocation) -> None:
        attachment = Attachment(inv.container_id, inv.ifname)
        freed = self._store(inv).release(attachment)  # needs only dataDir and the domain, not valid ranges
        log.info("DEL %s: freed %s", attachment, ", ".join(map(str, freed)) or "nothing")

    @_logged
    def check(self, inv: Invocation) -> None:
        config, store = self._configured(inv)
        attachment = Attachment(inv.container_id, inv.ifname)
        found = store.find(attachment)
        if found is None:
            raise CNIError(CHECK_FAILED, f"no reservation for {attachment} in {config.domain}",
                           "the addresses were released (DEL or GC) or never reserved: re-create the attachment")
        mine = {}
        for rs in config.range_sets:
            held = [ip for ip in found.addresses if rs.range_of(ip) is not None]
            if not held:
                raise CNIError(CHECK_FAILED, f"{attachment} holds no address in range {rs.describe()}",
                               "re-create the attachment (DEL, then ADD)")
            mine[held[0]] = rs.range_of(held[0]).interface(held[0])
        prev = inv.config.get("prevResult")
        if prev is not None:
            _check_prev_result(config, Result.from_json(prev, "prevResult"), mine)

    @_logged
    def gc(self, inv: Invocation) -> None:
        valid = valid_attachments(inv.config)
        if valid is None:
            # Without a keep-list we free nothing. cnitool's GC DELs the attachments in its own
            # cache and then sends GC without the key; freeing "everything not listed" would then
            # free every attachment of this domain, including those of other runtimes (and of
            # other networks sharing network_name) that this runtime knows nothing about.
            log.info("GC of %s without %s: nothing freed (an absent list is not an empty one)", inv.network_name, VALID_KEY)
            return
        freed = self._store(inv).gc(inv.network_name, valid)
        for reservation in freed:
            log.info("GC freed %s: %s", reservation.attachment, ", ".join(map(str, reservation.addresses)))

    @_logged
    def status(self, inv: Invocation) -> None:
        try:
            config, store = self._configured(inv)
        except CNIError as err:
            if err.code not in (IO_FAILURE, TRY_AGAIN_LATER):
                raise
            raise CNIError(NOT_AVAILABLE, err.msg, err.details) from None  # a pool not readable, or no block yet
        free = store.status(config.range_sets)
        for rs, count in zip(config.range_sets, free):
            if count == 0:
                raise CNIError(NOT_AVAILABLE, f"no free address in range {rs.describe()}",
                               "free addresses (DEL or GC attachments that are gone) or widen the range")


def _check_prev_result(config: "LeaseIPAMConfig", prev: Result, mine: dict[Any, Any]) -> None:
    listed = {ipc.address.ip: ipc.address for ipc in prev.ips}
    for ip, iface in mine.items():
        if listed.get(ip) != iface:
            raise CNIError(CHECK_FAILED, f"prevResult does not list the reserved address {iface}",
                           "the attachment differs from what ADD returned: re-create it")
    for ip, iface in listed.items():
        if ip not in mine and config.range_set_of(ip) is not None:
            raise CNIError(CHECK_FAILED, f"prevResult lists {iface}, which is not reserved for this attachment",
                           "the attachment differs from what ADD returned: re-create it")
