"""The fleet network: one bridge in the root namespace on a dedicated /24, veths into container namespaces,
taps for VMs. The controller owns .1 on the bridge, so every host is reachable by its own address, and hosts reach
each other over the bridge. Nothing is routed or NATed beyond the /24: hosts reach no registry.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json

from ops.staging.state import FleetState, StateStore
from ops.staging.system import StagingError, run

DEFAULT_SUBNET = "10.250.77.0/24"
# Host addresses inside the /24: lb1 .10, containers .11-.59, VMs .101-.199.
LB_OFFSET, CONTAINER_OFFSET, VM_OFFSET = 10, 10, 100
MAX_CONTAINERS, MAX_VMS = 49, 99


def fleet_tag(name: str) -> str:
    """Short stable tag for interface names (Linux allows 15 characters)."""
    return hashlib.sha1(name.encode()).hexdigest()[:6]


def bridge_name(fleet: str) -> str:
    return f"vlb{fleet_tag(fleet)}"


def host_link_name(fleet: str, host: str) -> str:
    """Root-namespace end of a host's veth, or a VM's tap: `vl` + tag + host (e.g. vl1a2b3cc1, vl1a2b3cvm1)."""
    name = f"vl{fleet_tag(fleet)}{host.replace('lb', 'b').replace('vm', 'v')}"
    if len(name) > 15:
        raise StagingError(f"host name {host!r} is too long for an interface name; use fewer hosts")
    return name


def netns_name(fleet: str, host: str) -> str:
    return f"vlfleet-{fleet}-{host}"


def host_address(subnet: str, host: str) -> str:
    net = ipaddress.ip_network(subnet)
    if host == "lb1":
        offset = LB_OFFSET
    elif host.startswith("c"):
        offset = CONTAINER_OFFSET + int(host[1:])
    elif host.startswith("vm"):
        offset = VM_OFFSET + int(host[2:])
    else:
        raise ValueError(f"unknown staging host name {host!r}")
    return str(net.network_address + offset)


def gateway(subnet: str) -> str:
    return str(ipaddress.ip_network(subnet).network_address + 1)


def vm_mac(fleet: str, ip: str) -> str:
    """Locally administered, stable MAC for a VM: the networkd file inside its disk matches on it."""
    tag = fleet_tag(fleet)
    last = ipaddress.ip_address(ip).packed[-1]
    return f"52:54:{tag[0:2]}:{tag[2:4]}:{tag[4:6]}:{last:02x}"


def _routes_in_use() -> list[ipaddress.IPv4Network]:
    out = run(["ip", "-j", "-4", "route", "show", "table", "all"], check=False)
    nets = []
    for r in json.loads(out or "[]"):
        dst = r.get("dst", "")
        if dst and dst != "default":
            try:
                nets.append(ipaddress.ip_network(dst, strict=False))
            except ValueError:
                continue
    return nets


def choose_subnet(name: str, requested: str | None, other_fleets: list[FleetState]) -> str:
    """The /24 for a fleet: the requested one, 10.250.77.0/24 for `default`, else a free 10.250.X.0/24."""
    taken = {f.subnet: f.name for f in other_fleets if f.name != name}
    if requested:
        net = ipaddress.ip_network(requested, strict=False)
        if net.prefixlen != 24 or net.version != 4:
            raise StagingError(f"subnet {requested} must be an IPv4 /24 (e.g. {DEFAULT_SUBNET})")
        if str(net) in taken:
            raise StagingError(f"subnet {net} is used by staging fleet {taken[str(net)]!r}; pick another --subnet")
        return str(net)
    routes = _routes_in_use()
    candidates = [DEFAULT_SUBNET] if name == "default" else []
    start = int(fleet_tag(name), 16) % 100
    candidates += [f"10.250.{78 + (start + i) % 100}.0/24" for i in range(100)]
    for cand in candidates:
        net = ipaddress.ip_network(cand)
        if cand not in taken and not any(net.overlaps(r) for r in routes):
            return cand
    raise StagingError("no free 10.250.X.0/24 for the fleet: pass --subnet explicitly")


def ensure_bridge(store: StateStore) -> None:
    st = store.state
    from ops.staging.resources import exists
    from ops.staging.state import Resource

    if exists(Resource("link", st.bridge)):
        if not any(r.kind == "link" and r.id == st.bridge for r in st.resources):
            raise StagingError(f"interface {st.bridge} exists but this fleet did not create it; remove it or rename")
        return
    # Conflicting address on another interface would make the fleet unreachable: refuse early.
    for net in _routes_in_use():
        if net.overlaps(ipaddress.ip_network(st.subnet)):
            raise StagingError(f"subnet {st.subnet} is already routed on this machine; choose another --subnet")
    run(["ip", "link", "add", "name", st.bridge, "type", "bridge"])
    store.record("link", st.bridge)
    run(["ip", "addr", "add", f"{gateway(st.subnet)}/24", "dev", st.bridge])
    run(["ip", "link", "set", st.bridge, "up"])


def create_netns_veth(store: StateStore, host: str, ip: str) -> str:
    """A netns for a container, joined to the bridge by a veth (eth0 inside). Returns the netns name."""
    st = store.state
    ns, link = netns_name(st.name, host), host_link_name(st.name, host)
    run(["ip", "netns", "add", ns])
    store.record("netns", ns, host)
    run(["ip", "link", "add", "name", link, "type", "veth", "peer", "name", "eth0", "netns", ns])
    store.record("link", link, host)
    run(["ip", "link", "set", link, "master", st.bridge, "up"])
    for cmd in (
        ["ip", "-n", ns, "link", "set", "lo", "up"],
        ["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0"],
        ["ip", "-n", ns, "link", "set", "eth0", "up"],
        ["ip", "-n", ns, "route", "add", "default", "via", gateway(st.subnet)],
    ):
        run(cmd)
    return ns


def create_tap(store: StateStore, host: str) -> str:
    st = store.state
    tap = host_link_name(st.name, host)
    run(["ip", "tuntap", "add", "dev", tap, "mode", "tap"])
    store.record("link", tap, host)
    run(["ip", "link", "set", tap, "master", st.bridge, "up"])
    return tap
