"""The data caches a footprint is held against: read from sysfs, given in settings, or reported by a
remote device. Without any, no cache-based pruning happens for that device."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SYSFS_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SPEC = re.compile(r"^\s*(L1d|L1|L2|L3|L4)\s*=\s*(\d+)\s*([KMG]?)i?B?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class CacheLevel:
    name: str  # "L1d", "L2", "L3"
    level: int
    bytes: int


@dataclass(frozen=True)
class CacheHierarchy:
    """Data and unified caches of one core's view, smallest first, and where the sizes came from."""

    levels: tuple[CacheLevel, ...]
    #: "sysfs", "settings", "rpc device", or "unknown" (no sizes: no pruning).
    source: str

    @property
    def known(self) -> bool:
        return bool(self.levels)

    def to_spec(self) -> str:
        """The sizes as a ``KILN_CACHE_SIZES``-style spec (what a remote device reports)."""
        return ",".join(f"{c.name}={c.bytes}" for c in self.levels)

    def to_json(self) -> dict[str, object]:
        return {
            "source": self.source,
            "levels": [{"name": c.name, "level": c.level, "bytes": c.bytes} for c in self.levels],
        }


UNKNOWN = CacheHierarchy((), "unknown")


def parse_size(text: str) -> int:
    """``"48K"``, ``"1024K"``, ``"32M"``, ``"32 MiB"`` or a byte count -> bytes."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text.strip(), re.IGNORECASE)
    if not match:
        raise ValueError(f"not a cache size: {text!r}")
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def parse_cache_spec(text: str, source: str = "settings") -> CacheHierarchy:
    """``"L1d=48K,L2=1M,L3=32M"`` -> a hierarchy (raises ValueError with the part it cannot read)."""
    levels = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = _SPEC.match(part)
        if not match:
            raise ValueError(f"cache sizes are 'L1d=48K,L2=1M,L3=32M'; cannot read {part!r}")
        name = match.group(1)
        name = "L1d" if name.lower() in ("l1", "l1d") else name.upper()
        levels.append(CacheLevel(name, int(name[1]), parse_size(match.group(2) + match.group(3))))
    return CacheHierarchy(tuple(sorted(levels, key=lambda c: c.level)), source)


def read_sysfs_caches(cache_dir: Path = SYSFS_CACHE_DIR) -> CacheHierarchy:
    """cpu0's data and unified caches from sysfs; :data:`UNKNOWN` where sysfs does not say."""
    levels = []
    for index in sorted(cache_dir.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        levels.append(CacheLevel("L1d" if level == 1 else f"L{level}", level, size))
    if not levels:
        return UNKNOWN
    return CacheHierarchy(tuple(sorted(levels, key=lambda c: c.level)), "sysfs")


def host_caches(override: str | None = None) -> CacheHierarchy:
    """This machine's caches: ``override`` (a spec from settings) when given, else sysfs."""
    return parse_cache_spec(override) if override else read_sysfs_caches()
