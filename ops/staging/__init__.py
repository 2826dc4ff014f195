"""Local staging fleets: systemd-nspawn containers and qemu VMs on one bridge, with an Ansible inventory.

Entry points are in `ops.staging.fleet` (`up`, `down`, `status`); the Fabric tasks in `ops.tasks.staging` wrap them.
"""
