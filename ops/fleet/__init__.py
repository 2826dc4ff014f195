"""The live fleet over SSH: its inventory, the host program and how it is called, releases, rollout, rollback,
rolling restart and status.

  inventory     hosts, groups and variables as Ansible reads them
  host_program  the host program (ops/host/) as one file: built, put on a host, checked by sha256
  transport     Fabric connections, the host program's command line and answer, the steps that change one host
  release       a release to roll out, what it changes in the env file, staging it on a host
  batches       batching and the --max-fail stop of a rolling change, independent of how a host is changed
  rollout       rollout, rollback, rolling restart
  status        `vlfleet status` rows and table (prometheus_text reads the metrics it needs)
  load          a bounded client loop through the load balancer during a change (rollout e2e, staging.scale)
"""

from ops.fleet.batches import BatchRun, HostResult, Outcome, RolloutError, describe_error, format_table, run_batches
from ops.fleet.inventory import FleetError, Host, Inventory, load_inventory, parse_inventory_json
from ops.fleet.release import Release, parse_env_option, release_changes, stage_release
from ops.fleet.rollout import restart, rollback, rollout
from ops.fleet.status import status, status_table
from ops.fleet.transport import Fleet, StepError, Timeouts, parse_step_output, step_args, step_name

__all__ = [
    "BatchRun",
    "Fleet",
    "FleetError",
    "Host",
    "HostResult",
    "Inventory",
    "Outcome",
    "Release",
    "RolloutError",
    "StepError",
    "Timeouts",
    "describe_error",
    "format_table",
    "load_inventory",
    "parse_env_option",
    "parse_inventory_json",
    "parse_step_output",
    "release_changes",
    "restart",
    "rollback",
    "rollout",
    "run_batches",
    "stage_release",
    "status",
    "status_table",
    "step_args",
    "step_name",
]
