"""Waivers: a failed check that the operator accepts, with a reason and an expiry date.

A waivers file (YAML) is a list of entries::

    - id: CLOCK-SYNC                        # a check id from the registry
      reason: staging VMs reach no NTP server
      expires: 2027-01-31                   # required: a waiver is a decision with a review date
      hosts: [vm1]                          # optional: only these inventory hosts (default: every host)

``--ignore ID`` waives a check on every host for this run only. A waived check still runs: a failure is reported
as ``waived`` (with the reason) and does not fail the run. An expired waiver is not applied and is itself an error.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import yaml

from ops.preflight import registry


class WaiverError(ValueError):
    """The waivers file or an --ignore id is unusable; the message says which entry and how to fix it."""


@dataclass(frozen=True)
class Waiver:
    id: str
    reason: str
    expires: dt.date | None = None  # None: --ignore on the command line (this run only)
    hosts: tuple[str, ...] = ()  # empty: every host
    source: str = "--ignore"

    def applies_to(self, host: str) -> bool:
        return not self.hosts or host in self.hosts

    def expired(self, today: dt.date) -> bool:
        return self.expires is not None and self.expires < today

    def describe(self) -> str:
        until = f" (until {self.expires.isoformat()})" if self.expires else ""
        return f"{self.reason}{until} [{self.source}]"

    def to_json(self) -> dict:
        return {"id": self.id, "reason": self.reason, "expires": self.expires.isoformat() if self.expires else None,
                "hosts": list(self.hosts), "source": self.source}


@dataclass
class WaiverSet:
    active: list[Waiver]
    expired: list[Waiver]

    def find(self, check_id: str, host: str) -> Waiver | None:
        return next((w for w in self.active if w.id == check_id and w.applies_to(host)), None)

    def expired_for(self, check_id: str, host: str) -> Waiver | None:
        return next((w for w in self.expired if w.id == check_id and w.applies_to(host)), None)

    def errors(self) -> list[str]:
        return [f"waiver for {w.id} expired on {w.expires}: {w.reason} [{w.source}]. Fix the host, or renew the "
                f"waiver with a new `expires:` date after review" for w in self.expired]

    def to_json(self) -> dict:
        return {"active": [w.to_json() for w in self.active], "expired": [w.to_json() for w in self.expired]}


def parse_ignore(text: str | None) -> list[Waiver]:
    """``--ignore CPU-AVX512,CLOCK-SYNC`` as waivers without expiry."""
    out = []
    for raw in (text or "").split(","):
        check_id = raw.strip().upper()
        if not check_id:
            continue
        _known(check_id, "--ignore")
        out.append(Waiver(check_id, "ignored on the command line (--ignore)"))
    return out


def load(path: Path | str, source: str | None = None) -> list[Waiver]:
    path = Path(path)
    where = source or str(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise WaiverError(f"waivers file {path}: cannot read it ({e.strerror})") from e
    except yaml.YAMLError as e:
        raise WaiverError(f"waivers file {path} is not valid YAML: {e}") from e
    if data is None:
        return []
    if not isinstance(data, list):
        raise WaiverError(f"waivers file {path}: expected a list of entries (- id: ..., reason: ..., expires: ...), "
                          f"got {type(data).__name__}")
    return [_entry(item, f"{where} entry {n}") for n, item in enumerate(data, 1)]


def _entry(item: object, where: str) -> Waiver:
    if not isinstance(item, dict):
        raise WaiverError(f"{where}: expected a mapping with id, reason, expires")
    unknown = set(item) - {"id", "reason", "expires", "hosts"}
    if unknown:
        raise WaiverError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; allowed: id, reason, expires, hosts")
    check_id = str(item.get("id") or "").strip().upper()
    _known(check_id, where)
    reason = str(item.get("reason") or "").strip()
    if not reason:
        raise WaiverError(f"{where} ({check_id}): a waiver needs a reason (why this host may launch anyway)")
    expires = item.get("expires")
    if isinstance(expires, str):
        try:
            expires = dt.date.fromisoformat(expires.strip())
        except ValueError:
            expires = None
    if isinstance(expires, dt.datetime):
        expires = expires.date()
    if not isinstance(expires, dt.date):
        raise WaiverError(f"{where} ({check_id}): `expires` must be a date like 2027-01-31 "
                          f"(got {item.get('expires')!r}); waivers without a review date are not accepted")
    hosts = item.get("hosts") or []
    if isinstance(hosts, str):
        hosts = [hosts]
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise WaiverError(f"{where} ({check_id}): `hosts` must be a list of inventory host names")
    return Waiver(check_id, reason, expires, tuple(hosts), source=where)


def _known(check_id: str, where: str) -> None:
    if check_id not in registry.ids():
        raise WaiverError(f"{where}: unknown check id {check_id!r}; known ids: {', '.join(registry.ids())}")


def build(waivers_file: Path | str | None, ignore: str | None, today: dt.date | None = None) -> WaiverSet:
    """All waivers of a run, split into active and expired as of ``today`` (default: the local date)."""
    today = today or dt.date.today()
    entries = parse_ignore(ignore) + (load(waivers_file) if waivers_file else [])
    return WaiverSet([w for w in entries if not w.expired(today)], [w for w in entries if w.expired(today)])
