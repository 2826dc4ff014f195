"""The live fleet over SSH: its inventory, the host program and how it is called, releases, rollout, rollback,
rolling restart, status and tune.

  inventory     hosts, groups and variables as Ansible reads them
  host_program  the host program (ops/host/) as one file: built, put on a host, checked by sha256
  transport     Fabric connections, the host program's command line and answer, the lb drain
  release       a release to roll out, what it changes in the env file, staging it on a host
  batches       batching and the --max-fail stop of a rolling change, independent of how a host is changed
  rollout       rollout, rollback, rolling restart, and the steps that change one host
  status        `vlfleet status` rows and table (prometheus_text reads the metrics it needs)
  tune          `vlfleet tune`: a measured choice of engine per host
  load          a bounded client loop through the load balancer during a change (rollout e2e, staging.scale)
"""

from ops.fleet.batches import Outcome
from ops.fleet.host_program import StepError
from ops.fleet.inventory import FleetError, load_inventory
from ops.fleet.release import Release, parse_env_option
from ops.fleet.rollout import restart, rollback, rollout
from ops.fleet.status import status, status_table
from ops.fleet.transport import Fleet, Timeouts

__all__ = [
    "Fleet",
    "FleetError",
    "Outcome",
    "Release",
    "StepError",
    "Timeouts",
    "load_inventory",
    "parse_env_option",
    "restart",
    "rollback",
    "rollout",
    "status",
    "status_table",
]
