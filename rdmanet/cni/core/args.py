"""CNI_ARGS parsing, more lenient than libcni's LoadArgs (containernetworking/cni pkg/types/args.go,
which fails on a value containing '=' and on an empty pair).

Multus appends its own pairs to the runtime's (multus-cni pkg/types/conf.go), so a key may
appear twice (the last wins), values may contain '=' (split on the first), and empty pairs are
skipped. Unknown keys are always tolerated: plugins look up only the keys they know.
"""

from __future__ import annotations

from .errors import INVALID_ENVIRONMENT, CNIError


def parse_cni_args(raw: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in raw.split(";"):
        if not pair.strip():
            continue
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise CNIError(
                INVALID_ENVIRONMENT,
                f"CNI_ARGS: invalid pair {pair!r}",
                "CNI_ARGS must be KEY=VALUE pairs separated by ';'",
            )
        out[key] = value
    return out


def split_list(value: str) -> list[str]:
    """Multus joins several IPs in one IP= value with commas."""
    return [item.strip() for item in value.split(",") if item.strip()]
