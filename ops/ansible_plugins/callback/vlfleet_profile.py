"""Ansible callback `vlfleet_profile`: per-task and per-role wall time, per-host recap, what changed where.

The profile_tasks/profile_roles callbacks live in ansible.posix, which a bare ansible-core controller lacks; this
is the same measurement (a task lasts until the next one starts) plus a machine-readable report. It prints the
slowest roles and tasks at the end of the run and, when VLFLEET_PROFILE_JSON names a file, writes there:
{"tasks": [...], "roles": {role: seconds}, "recap": {host: {ok, changed, ...}}, "changed": {host: [task, ...]},
 "failed": {host: [{"task", "msg"}]}, "duration": seconds}.
"""

from __future__ import annotations

import json
import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
    name: vlfleet_profile
    type: aggregate
    short_description: per-task and per-role timing plus a JSON report of the run
    description:
      - Times every task and role, records per-host recaps and the tasks that changed something.
      - Writes the report to the file named by the VLFLEET_PROFILE_JSON environment variable, if set.
    requirements:
      - enable in ansible.cfg (callbacks_enabled) or ANSIBLE_CALLBACKS_ENABLED
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "vlfleet_profile"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._start = time.monotonic()
        self._tasks: list[dict] = []
        self._current: dict | None = None
        self._changed: dict[str, list[str]] = {}
        self._failed: dict[str, list[dict]] = {}
        self._play = ""

    def _close_current(self) -> None:
        if self._current is not None:
            self._current["seconds"] = round(time.monotonic() - self._current.pop("_t0"), 3)
            self._tasks.append(self._current)
            self._current = None

    def _open(self, task, handler: bool = False) -> None:
        self._close_current()
        role = task._role.get_name(include_role_fqcn=False) if getattr(task, "_role", None) else ""
        name = task.get_name()
        if role and name.startswith(role + " : "):
            name = name[len(role) + 3:]
        self._current = {"play": self._play, "role": role, "task": name, "handler": handler,
                         "_t0": time.monotonic()}

    def v2_playbook_on_play_start(self, play) -> None:
        self._close_current()
        self._play = play.get_name()

    def v2_playbook_on_task_start(self, task, is_conditional) -> None:
        self._open(task)

    def v2_playbook_on_handler_task_start(self, task) -> None:
        self._open(task, handler=True)

    def v2_runner_on_ok(self, result) -> None:
        if result._result.get("changed"):
            self._changed.setdefault(result._host.get_name(), []).append(result._task.get_name())

    def v2_runner_on_failed(self, result, ignore_errors: bool = False) -> None:
        if ignore_errors:
            return
        msg = result._result.get("msg") or result._result.get("stderr") or ""
        self._failed.setdefault(result._host.get_name(), []).append(
            {"task": result._task.get_name(), "msg": str(msg)[:4000]})

    def v2_runner_on_unreachable(self, result) -> None:
        self._failed.setdefault(result._host.get_name(), []).append(
            {"task": result._task.get_name(), "msg": "unreachable: " + str(result._result.get("msg", ""))})

    def v2_playbook_on_stats(self, stats) -> None:
        self._close_current()
        roles: dict[str, float] = {}
        for t in self._tasks:
            key = t["role"] or "(play)"
            roles[key] = round(roles.get(key, 0.0) + t["seconds"], 3)
        recap = {host: stats.summarize(host) for host in sorted(stats.processed)}
        duration = round(time.monotonic() - self._start, 3)
        self._display.banner("VLFLEET PROFILE (wall time; a task lasts until the next one starts)")
        for role, seconds in sorted(roles.items(), key=lambda kv: -kv[1]):
            self._display.display(f"{role:<30} {seconds:9.1f} s")
        self._display.display(f"{'total':<30} {duration:9.1f} s")
        for t in sorted(self._tasks, key=lambda t: -t["seconds"])[:8]:
            self._display.display(f"  {t['seconds']:8.1f} s  {t['role'] or '-'} : {t['task']}")
        path = os.environ.get("VLFLEET_PROFILE_JSON")
        if path:
            report = {"tasks": self._tasks, "roles": roles, "recap": recap, "changed": self._changed,
                      "failed": self._failed, "duration": duration}
            with open(path, "w") as f:
                json.dump(report, f, indent=1)
