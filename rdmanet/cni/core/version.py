"""CNI spec versions: which we speak and which verbs each one allows (SPEC.md, skel.go)."""

from __future__ import annotations

from .errors import INCOMPATIBLE_VERSION, CNIError

SUPPORTED_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
LATEST = "1.1.0"
# A config without cniVersion is read as this (libcni and skel do the same).
IMPLICIT_VERSION = "0.1.0"

# The lowest config version each verb needs; ADD and DEL work at every supported version.
_MIN_VERSION = {"CHECK": "0.4.0", "GC": "1.1.0", "STATUS": "1.1.0"}


def parse(version: str) -> tuple[int, int, int]:
    """'1.0.0' -> (1, 0, 0); raises ValueError on anything else."""
    parts = version.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"invalid version {version!r}")
    return int(parts[0]), int(parts[1]), int(parts[2])


def at_least(version: str, minimum: str) -> bool:
    return parse(version) >= parse(minimum)


def require_supported(version: str, command: str) -> None:
    """Exact-match gating: the config version must be one we speak and allow the verb."""
    if version not in SUPPORTED_VERSIONS:
        raise CNIError(
            INCOMPATIBLE_VERSION,
            f"incompatible CNI versions: config is {version!r}, plugin supports {list(SUPPORTED_VERSIONS)}",
            "set cniVersion to one of the supported versions",
        )
    minimum = _MIN_VERSION.get(command)
    if minimum and not at_least(version, minimum):
        raise CNIError(
            INCOMPATIBLE_VERSION,
            f"config version {version} does not allow {command}",
            f"{command} needs cniVersion {minimum} or newer",
        )


def version_info() -> dict:
    """The VERSION verb's answer: like Go's skel, it reports the latest version, not the input's."""
    return {"cniVersion": LATEST, "supportedVersions": list(SUPPORTED_VERSIONS)}
