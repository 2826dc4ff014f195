"""`vlfleet staging.scale` without a fleet: Ansible settings, the converge ratio, the report, its markdown, the
rollout record, and the client loop (`ops.fleet.load`) against a stub server."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ops.fleet.batches import BatchRun, HostResult, Outcome
from ops.fleet.load import Load, summarize
from ops.paths import repo_root
from ops.staging import scale
from ops.staging.scale import Measurement, build_report, render_markdown


def _measured(**kw) -> Measurement:
    m = Measurement(hosts=8, name="scale", machine={"cpu": "Test CPU", "isa": ["avx2", "fma"], "cpus": 2,
                                                    "loadavg": "1.0 1.0 1.0"},
                    started="2026-12-01T10:00:00+00:00", finished="2026-12-01T10:40:00+00:00")
    m.fleet = {"inventory": "/x/inventory.yml", "subnet": "10.250.9.0/24", "reused": False,
               "service_hosts": [f"c{i}" for i in range(1, 9)], "lb_hosts": ["lb1"], "converged_before": []}
    m.ansible = {"forks": 10, "forks_configured": 10, "pipelining": True, "control_persist": "60s"}
    m.steps = {"fleet_up": 30.0, "prepare": 5.0, "converge_one": 300.0, "converge_all": 540.0, "rollout": 200.0}
    m.converge = {"one": {"limit": "c1,lb1", "seconds": 300.0, "ok": True},
                  "all": {"limit": "all", "seconds": 540.0, "ok": True}}
    m.rollout = {"release": "scale-1", "batch": "1,25%,50%", "ok": True, "seconds": 190.0, "hosts": 8,
                 "hosts_on_release": 8, "requests": 400, "streamed": 200, "failures": 0, "failed": [],
                 "p50_first_token_s": 0.21, "p95_first_token_s": 0.9}
    for k, v in kw.items():
        setattr(m, k, v)
    return m


# --- ansible settings ------------------------------------------------------------------------------------------
def test_ansible_settings_read_the_config_and_the_environment_wins():
    cfg = "[defaults]\nforks = 10\n\n[ssh_connection]\npipelining = True\nssh_args = -o ControlMaster=auto " \
          "-o ControlPersist=60s\n"
    assert scale.ansible_settings(cfg) == {"forks": 10, "pipelining": True, "control_persist": "60s"}
    assert scale.ansible_settings(cfg, {"ANSIBLE_FORKS": "20", "ANSIBLE_PIPELINING": "false"})["forks"] == 20
    assert scale.ansible_settings(cfg, {"ANSIBLE_PIPELINING": "false"})["pipelining"] is False
    assert scale.ansible_settings("[defaults]\n") == {"forks": 5, "pipelining": False, "control_persist": None}


def test_the_project_config_runs_the_default_scale_fleet_in_one_wave():
    settings = scale.ansible_settings((repo_root() / "ansible.cfg").read_text())
    assert settings["forks"] >= scale.forks_needed(8) == 9
    assert settings["pipelining"] and settings["control_persist"]


# --- ratio and report ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("one", "every", "ratio"), [(300, 540, 1.8), (100, 250, 2.5), (None, 10, None),
                                                     (0, 10, None), (10, None, None)])
def test_converge_ratio(one, every, ratio):
    assert scale.converge_ratio(one, every) == ratio


def test_judge_against_the_goal():
    assert scale.judge(2.0) == {"ratio": 2.0, "goal": "<= 2x", "met": True}
    assert scale.judge(2.01)["met"] is False
    assert scale.judge(None)["met"] is None


def test_report_of_a_complete_run():
    report = build_report(_measured())
    assert report["ok"] and not report["error"]
    assert report["hosts"] == 8 and report["date"] == "2026-12-01T10:00:00+00:00"
    assert report["machine"]["cpu"] == "Test CPU" and report["machine"]["isa"] == ["avx2", "fma"]
    assert report["fleet"]["name"] == "scale" and report["fleet"]["inventory"] == "/x/inventory.yml"
    assert report["converge"]["ratio"] == 1.8 and report["converge"]["met"] is True
    assert report["converge"]["goal"] == "<= 2x" and "note" not in report["converge"]
    assert report["steps_s"]["converge_all"] == 540.0
    assert report["rollout"]["failures"] == 0
    json.dumps(report)  # serialisable as is


def test_no_ratio_when_a_converge_failed_and_the_failure_is_kept():
    m = _measured(error="site.yml on all hosts failed", failed_step="converge_all", rollout={})
    m.converge["all"]["ok"] = False
    report = build_report(m)
    assert not report["ok"] and report["failed_step"] == "converge_all"
    assert report["converge"]["ratio"] is None and report["converge"]["met"] is None


def test_reused_converged_fleet_is_flagged():
    m = _measured()
    m.fleet["converged_before"] = ["c1", "c2"]
    assert "re-converges" in build_report(m)["converge"]["note"]


# --- markdown --------------------------------------------------------------------------------------------------
def test_markdown_says_what_was_timed_and_the_verdict():
    md = render_markdown(build_report(_measured()))
    assert md.startswith("# Staging scale: 8 hosts\n")
    assert "site.yml --limit c1,lb1" in md and "c2..c8 fresh" in md
    assert "**1.80x** (goal <= 2x: met)" in md
    assert "400 requests (200 streamed)" in md and "**0 failed**" in md and "p95 0.90 s" in md
    assert "Test CPU" in md and "avx2 fma" in md and "forks 10" in md
    assert "Failed" not in md


def test_markdown_of_a_partial_run():
    m = Measurement(hosts=2, name="scale", started="2026-12-01T10:00:00+00:00", error="fleet 'scale': boom",
                    failed_step="fleet_up", steps={"fleet_up": 12.0})
    md = render_markdown(build_report(m))
    assert "| fleet up (`staging.up`) (failed) | 12 |" in md
    assert "ratio not measured" in md and "**Rollout**: not run." in md
    assert "**Failed** at `fleet_up`: fleet 'scale': boom" in md


def test_not_met_is_loud():
    m = _measured()
    m.converge["all"]["seconds"] = 900.0
    assert "**3.00x** (goal <= 2x: NOT met)" in render_markdown(build_report(m))


def test_results_are_written_by_host_count(tmp_path):
    json_path, md_path = scale.write_results(build_report(_measured()), tmp_path / "scale")
    assert json_path.name == "scale-8-hosts.json" and md_path.name == "scale-8-hosts.md"
    assert json.loads(json_path.read_text())["converge"]["ratio"] == 1.8
    assert md_path.read_text().startswith("# Staging scale")


@pytest.mark.parametrize("hosts", [1, 50])
def test_a_host_count_out_of_range_is_refused_before_anything_starts(tmp_path, hosts):
    with pytest.raises(scale.ScaleError, match=r"--hosts must be 2\.\.49"):
        scale.run("scale", hosts, out_dir=tmp_path)
    assert not any(tmp_path.iterdir())


def test_markdown_names_the_fresh_hosts_of_a_two_host_fleet():
    m = _measured(hosts=2)
    assert "(site.yml, c2 fresh)" in render_markdown(build_report(m))


# --- rollout record and the client loop ------------------------------------------------------------------------
def test_rollout_record_counts_outcomes_and_carries_the_load_summary():
    report = BatchRun("rollout", "scale-1", results=[HostResult("c1", Outcome.OK, "scale-1", "s0", seconds=20, batch=1),
                                                    HostResult("c2", Outcome.ROLLED_BACK, "s0", "s0", batch=2)],
                    batches=[["c1"], ["c2"]], seconds=41.0)
    log = [{"stream": True, "ok": True, "first_token_s": 0.2}, {"stream": False, "ok": True, "first_token_s": 0.5},
           {"stream": True, "ok": False, "error": "ConnectionResetError"}]
    rec = scale.rollout_record(report, summarize(log), "scale-1", 50.0)
    assert rec["hosts"] == 2 and rec["hosts_on_release"] == 1 and not rec["ok"]
    assert rec["outcomes"] == {"ok": 1, "rolled back": 1}
    assert rec["requests"] == 3 and rec["streamed"] == 2 and rec["failures"] == 1
    assert rec["p50_first_token_s"] == 0.2 and rec["per_host"][0] == {"host": "c1", "batch": 1, "result": "ok",
                                                                      "seconds": 20}


def test_summarize_without_streams():
    assert summarize([]) == {"requests": 0, "streamed": 0, "failures": 0, "failed": [], "p50_first_token_s": None,
                             "p95_first_token_s": None}


class _Chat(BaseHTTPRequestHandler):
    def do_POST(self):  # the http.server hook
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        if body["stream"]:
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for word in ("a", "b"):
                self.wfile.write(f'data: {{"choices": [{{"delta": {{"content": "{word}"}}}}]}}\n\n'.encode())
            self.wfile.write(b"data: [DONE]\n\n")
        else:
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps({"usage": {"completion_tokens": 8}}).encode())

    def log_message(self, *args):
        pass


def test_load_loops_until_its_bound_and_records_every_request():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with Load("127.0.0.1", server.server_address[1], max_requests=6, pause=0.01, max_seconds=30) as load:
            for _ in range(300):
                if len(load.log) >= 6:
                    break
                threading.Event().wait(0.1)
        summary = load.summary()
    finally:
        server.shutdown()
        server.server_close()
    assert 6 <= summary["requests"] <= 8  # each client checks the bound before its next request
    assert summary["failures"] == 0 and summary["streamed"] >= 3
    assert summary["p50_first_token_s"] is not None
