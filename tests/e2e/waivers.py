"""What a staging fleet cannot provide, waived with the reason: one list for every e2e module that runs the checklist.

The CPU-AVX512 waiver follows the CPU each host really has (its /proc/cpuinfo, read over SSH): containers share the
controller's CPU, which may be AVX2-only, and TCG VMs never have AVX-512. A host whose CPU has AVX-512 gets no
waiver, so the check must pass there.
"""

from __future__ import annotations

import datetime as dt
import resource
from pathlib import Path

import yaml

from tests.e2e.hostcmd import sudo


def cpu_flags(host: dict) -> set[str]:
    return set(sudo(host, "grep -m1 '^flags' /proc/cpuinfo").split(":", 1)[1].split())


def without_avx512(hosts: dict[str, dict]) -> list[str]:
    """The service hosts whose CPU lacks avx512f."""
    return [name for name, h in hosts.items() if "vlm" in h["groups"] and "avx512f" not in cpu_flags(h)]


def staging_waivers(hosts: dict[str, dict], path: Path) -> Path:
    """Write the waivers file for ``hosts`` (an inventory's hosts_of()) to ``path``."""
    expires = (dt.date.today() + dt.timedelta(days=30)).isoformat()
    vlm = {n: h for n, h in hosts.items() if "vlm" in h["groups"]}
    vms = [n for n, h in vlm.items() if h.get("vlfleet_staging_kind") == "vm"]
    containers = [n for n, h in vlm.items() if h.get("vlfleet_staging_kind") == "container"]
    entries = []
    if vms:
        entries.append(_entry("CLOCK-SYNC", vms, expires, "staging VMs reach no NTP server"))
    no_avx512 = without_avx512(vlm)
    if no_avx512:
        entries.append(_entry("CPU-AVX512", no_avx512, expires,
                              "this host's CPU has no avx512f in /proc/cpuinfo (TCG VM, or the controller's CPU)"))
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard < 65535 and containers:
        # The controller's own hard limit caps nspawn containers' PID 1, so their services cannot get 65535.
        entries.append(_entry("SVC-NOFILE", containers, expires,
                              f"staging controller caps open files at {hard} for containers"))
    path.write_text(yaml.safe_dump(entries, sort_keys=False))
    return path


def _entry(check_id: str, hosts: list[str], expires: str, reason: str) -> dict:
    return {"id": check_id, "hosts": hosts, "expires": expires, "reason": reason}
