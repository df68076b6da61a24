"""The doctor's findings and how they are shown: a table for people, JSON for machines.

JSON schema of ``rdmanet doctor -o json`` (stable; new keys may be added)::

    {"ok": <no error finding>,
     "summary": {"ok": n, "info": n, "warn": n, "error": n},
     "findings": [{"severity", "area", "subject", "message", "fix"}],
     "inventory": {...}}   # what the checks read (NICs, RDMA devices, modules, files): for scripts

``severity`` is one of ok (checked, fine), info (a fact, nothing to judge), warn (works, but
not as well as it could or not everywhere), error (something the plugins need is broken);
``fix`` says what to do ("" when nothing is to be done).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

OK = "ok"
INFO = "info"
WARN = "warn"
ERROR = "error"
SEVERITIES = (OK, INFO, WARN, ERROR)

# The order areas are shown in: hardware up, then the CNI install, then the services it talks to.
AREAS = ("nic", "link", "rdma", "rdma-mode", "sriov", "modules", "dev", "cni-bin", "cni-conf", "network",
         "daemon", "ipam", "node", "policy", "doctor")


@dataclass(frozen=True)
class Finding:
    severity: str
    area: str
    subject: str
    message: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

    def to_json(self) -> dict:
        return asdict(self)


def ok(area: str, subject: str, message: str, fix: str = "") -> Finding:
    return Finding(OK, area, subject, message, fix)


def info(area: str, subject: str, message: str, fix: str = "") -> Finding:
    return Finding(INFO, area, subject, message, fix)


def warn(area: str, subject: str, message: str, fix: str) -> Finding:
    return Finding(WARN, area, subject, message, fix)


def error(area: str, subject: str, message: str, fix: str) -> Finding:
    return Finding(ERROR, area, subject, message, fix)


def ordered(findings: Iterable[Finding]) -> list[Finding]:
    """By area (``AREAS`` order), keeping the checks' own order inside an area."""
    rank = {a: i for i, a in enumerate(AREAS)}
    return sorted(findings, key=lambda f: rank.get(f.area, len(AREAS)))


def summary(findings: Sequence[Finding]) -> dict:
    return {s: sum(1 for f in findings if f.severity == s) for s in SEVERITIES}


def exit_code(findings: Sequence[Finding]) -> int:
    """0 when no finding is an error, else 1."""
    return 1 if any(f.severity == ERROR for f in findings) else 0


def render_json(findings: Sequence[Finding], inventory: Any = None) -> str:
    doc = {"ok": exit_code(findings) == 0, "summary": summary(findings),
           "findings": [f.to_json() for f in findings], "inventory": inventory or {}}
    return json.dumps(doc, indent=2, default=str) + "\n"


def render_table(findings: Sequence[Finding]) -> str:
    """One line per finding (SEVERITY AREA SUBJECT FINDING), then its ``fix:`` (warn, error) or
    ``hint:`` (ok, info) on the next line under FINDING, then a summary line."""
    headers = ("SEVERITY", "AREA", "SUBJECT", "FINDING")
    rows = [(f.severity, f.area, f.subject, f.message) for f in findings]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers[:3])]
    indent = sum(widths) + 2 * 3

    def line(cells: Sequence[str]) -> str:
        return ("  ".join(c.ljust(w) for c, w in zip(cells[:3], widths)) + "  " + cells[3]).rstrip()

    out = [line(headers)]
    for f, row in zip(findings, rows):
        out.append(line(row))
        if f.fix:
            out.append(" " * indent + ("fix: " if f.severity in (WARN, ERROR) else "hint: ") + f.fix)
    counts = summary(findings)
    verdict = "no errors" if exit_code(findings) == 0 else "fix the errors above"
    out.append("")
    out.append(f"{counts[OK]} ok, {counts[INFO]} info, {counts[WARN]} warn, {counts[ERROR]} error: {verdict}")
    return "\n".join(out) + "\n"
