"""Fleet addressing and interface naming."""

from __future__ import annotations

import ipaddress

import pytest

from ops.staging import network
from ops.staging.state import FleetState
from ops.staging.system import StagingError


def test_host_addresses_are_fixed_per_name():
    s = network.DEFAULT_SUBNET
    assert network.host_address(s, "lb1") == "10.250.77.10"
    assert network.host_address(s, "c1") == "10.250.77.11"
    assert network.host_address(s, "c49") == "10.250.77.59"
    assert network.host_address(s, "vm1") == "10.250.77.101"
    assert network.gateway(s) == "10.250.77.1"
    with pytest.raises(ValueError):
        network.host_address(s, "db1")


def test_address_ranges_do_not_collide():
    s = network.DEFAULT_SUBNET
    names = ["lb1"] + [f"c{i}" for i in range(1, network.MAX_CONTAINERS + 1)] + \
        [f"vm{i}" for i in range(1, network.MAX_VMS + 1)]
    addrs = [network.host_address(s, n) for n in names]
    assert len(set(addrs)) == len(addrs)
    net = ipaddress.ip_network(s)
    assert all(ipaddress.ip_address(a) in net and a != network.gateway(s) for a in addrs)


@pytest.mark.parametrize("fleet", ["default", "noavx2", "a-rather-long-fleet-name1"])
@pytest.mark.parametrize("host", ["c1", "c49", "vm99", "lb1"])
def test_interface_names_fit_linux_limit_and_differ_per_fleet(fleet, host):
    link = network.host_link_name(fleet, host)
    assert len(link) <= 15 and len(network.bridge_name(fleet)) <= 15
    assert link != network.host_link_name("other", host)


def test_vm_mac_is_locally_administered_and_stable():
    mac = network.vm_mac("default", "10.250.77.101")
    assert mac == network.vm_mac("default", "10.250.77.101")
    assert int(mac.split(":")[0], 16) & 0b10  # locally administered bit
    assert mac != network.vm_mac("default", "10.250.77.102")


def test_choose_subnet_default_and_requested():
    assert network.choose_subnet("default", None, []) == network.DEFAULT_SUBNET
    assert network.choose_subnet("x", "10.251.3.7/24", []) == "10.251.3.0/24"
    with pytest.raises(StagingError, match="/24"):
        network.choose_subnet("x", "10.251.0.0/16", [])


def test_choose_subnet_avoids_other_fleets():
    other = FleetState("default", network.DEFAULT_SUBNET, "vlbx")
    with pytest.raises(StagingError, match="used by staging fleet 'default'"):
        network.choose_subnet("x", network.DEFAULT_SUBNET, [other])
    picked = network.choose_subnet("noavx2", None, [other])
    assert picked != network.DEFAULT_SUBNET and picked.startswith("10.250.")
    # Another fleet that holds the picked subnet pushes the choice elsewhere.
    assert network.choose_subnet("noavx2", None, [other, FleetState("y", picked, "vlby")]) != picked
