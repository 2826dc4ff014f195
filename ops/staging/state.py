"""A fleet's state.json: its shape and every system object `up` created, recorded the moment it exists.

`down` removes exactly these objects in reverse order of creation and never looks anything up by name pattern,
so an interrupted `up` is still fully undone by `down`.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ops.paths import cache_root

# Kinds of recorded objects, in the order a host creates them; removal runs backwards.
KINDS = ("dir", "file", "mount", "netns", "link", "process")


@dataclass
class Resource:
    kind: str  # one of KINDS
    id: str  # path, netns name, link name or pid
    host: str = ""  # "" for fleet-wide objects (bridge, key, inventory)
    extra: dict = field(default_factory=dict)  # e.g. a process's start time, to detect pid reuse

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown resource kind {self.kind!r} (expected one of {', '.join(KINDS)})")

    def label(self) -> str:
        return f"{self.kind} {self.id}" + (f" ({self.host})" if self.host else "")


@dataclass
class HostRecord:
    name: str
    kind: str  # container | vm
    ip: str
    groups: list[str]
    mac: str = ""
    cpu: str = ""  # qemu -cpu model for VMs
    accel: str = ""  # tcg | kvm for VMs


@dataclass
class FleetState:
    name: str
    subnet: str
    bridge: str
    hosts: dict[str, HostRecord] = field(default_factory=dict)
    resources: list[Resource] = field(default_factory=list)
    settings: dict = field(default_factory=dict)  # the up() parameters the fleet was made with

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> FleetState:
        raw = json.loads(text)
        return cls(
            name=raw["name"], subnet=raw["subnet"], bridge=raw["bridge"],
            hosts={k: HostRecord(**v) for k, v in raw.get("hosts", {}).items()},
            resources=[Resource(**r) for r in raw.get("resources", [])],
            settings=raw.get("settings", {}),
        )

    def host_resources(self, host: str) -> list[Resource]:
        return [r for r in self.resources if r.host == host]


def fleets_dir() -> Path:
    return cache_root() / "staging" / "fleets"


def fleet_dir(name: str) -> Path:
    return fleets_dir() / name


class StateStore:
    """state.json of one fleet, safe to update from the threads that bring hosts up in parallel."""

    def __init__(self, path: Path, state: FleetState) -> None:
        self.path = path
        self.state = state
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: Path) -> StateStore | None:
        if not path.is_file():
            return None
        return cls(path, FleetState.from_json(path.read_text()))

    def save(self) -> None:
        with self._lock:
            self._write()

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(self.state.to_json())
        os.replace(tmp, self.path)

    def record(self, kind: str, ident: str | int, host: str = "", **extra) -> Resource:
        res = Resource(kind, str(ident), host, dict(extra))
        with self._lock:
            self.state.resources.append(res)
            self._write()
        return res

    def forget(self, res: Resource) -> None:
        with self._lock:
            self.state.resources = [r for r in self.state.resources if r is not res]
            self._write()

    def set_host(self, rec: HostRecord) -> None:
        with self._lock:
            self.state.hosts[rec.name] = rec
            self._write()

    def drop_host(self, name: str) -> None:
        with self._lock:
            self.state.hosts.pop(name, None)
            self._write()
