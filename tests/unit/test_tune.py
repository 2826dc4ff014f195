"""`vlfleet tune` (ops/fleet/tune.py): which engines are candidates, the memory budget, the score, the pick, the
record; the host program's override file and peak memory on local files; the status and report engine column; and one
fleet run through real Fabric connections against Fabric's MockRemote (no network)."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from fabric.testing.base import Command, MockRemote, Session

from ops.fleet import Fleet, FleetError, Timeouts
from ops.fleet import tune as t
from ops.fleet.inventory import parse_inventory_json
from ops.fleet.status import status_table
from ops.fleet.transport import step_args, step_name
from ops.host import layout, system, tune
from ops.host.errors import HostError
from ops.report import page
from service.runtime import contract, settings

MiB = 1024 * 1024
NO_SERVER = {"env": {}, "llama_server": {"path": "", "exists": False}}


def _run(total: float, first: float = 0.5, tokens: int = 16, error: str | None = None) -> dict:
    """A row as the host program's `latency` probe prints it."""
    return {"status": 200, "first_token_s": first, "total_s": total, "tokens": tokens, "ms_per_token": 40.0,
            "error": error}


# -- candidates ---------------------------------------------------------------------------------------------------

def test_default_candidates_skip_batching_and_an_unshipped_llamacpp_with_reasons():
    steps = dict(t.plan(None, None, NO_SERVER))
    default = ["direct", "serial", "batching", "llamacpp", "hybrid", "paged"]
    assert list(steps) == default == list(contract.ENGINES)
    assert steps["serial"] is None and steps["direct"] is None
    assert "concurrent" in steps["batching"] and "--engines" in steps["batching"]
    assert "no llama-server on the host" in steps["llamacpp"] and "vlfleet site --gguf" in steps["llamacpp"]
    assert steps["hybrid"] == steps["llamacpp"]  # the same wheel and GGUF artifact


def test_hybrid_needs_what_llamacpp_needs():
    server = {"path": "/opt/llama/llama-server", "exists": True, "model_dir": "/opt/vlfleet/models/g1",
              "model_exists": True}
    assert dict(t.plan(("hybrid",), None, {"llama_server": server}))["hybrid"] is None
    assert "no llama-server on the host" in dict(t.plan(("hybrid",), None, NO_SERVER))["hybrid"]
    assert dict(t.plan(None, None, {"llama_server": server}))["hybrid"] is None  # a default candidate there


def test_llamacpp_is_a_candidate_only_where_its_binary_and_gguf_artifact_exist():
    server = {"path": "/opt/llama/llama-server", "exists": True, "model_dir": "/opt/vlfleet/models/g1",
              "model_exists": True}
    assert dict(t.plan(None, None, {"llama_server": server}))["llamacpp"] is None
    missing = dict(t.plan(None, None, {"llama_server": {**server, "exists": False}}))["llamacpp"]
    assert "/opt/llama/llama-server is not an executable file" in missing
    no_gguf = dict(t.plan(None, None, {"llama_server": {**server, "model_dir": "", "model_exists": False}}))
    assert "no GGUF artifact" in no_gguf["llamacpp"] and "VLFLEET_LLAMACPP_MODEL_DIR=unset" in no_gguf["llamacpp"]


def test_named_engines_and_a_pin_are_measured_as_asked():
    assert t.plan(("batching", "serial"), None, NO_SERVER) == [("batching", None), ("serial", None)]
    assert t.plan(None, "direct", NO_SERVER) == [("direct", None)]
    assert t.parse_engines("serial, direct,serial") == ("serial", "direct")
    assert t.parse_engines("") is None
    with pytest.raises(FleetError, match="unknown engine vllm: use direct, serial, batching, llamacpp, hybrid"):
        t.parse_engines("serial,vllm")


def test_the_agent_knows_exactly_the_engines_the_service_accepts():
    for engine in contract.ENGINES:
        assert settings.load({"VLFLEET_ENGINE": engine, "VLFLEET_MODEL_DIR": "/m"}).engine == engine
    with pytest.raises(settings.SettingsError):
        settings.load({"VLFLEET_ENGINE": "vllm", "VLFLEET_MODEL_DIR": "/m"})
    with pytest.raises(HostError, match="engine 'vllm'"):
        tune.override_text("vllm")


# -- budget, score, pick ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("info", "limit", "source"), [
    ({"env": {"VLFLEET_MEMORY_LIMIT_MB": "1000"}, "memory_high": 5000 * MiB}, 800 * MiB,
     "80% of VLFLEET_MEMORY_LIMIT_MB=1000"),
    ({"env": {"VLFLEET_MEMORY_HIGH_WATER": "0.5"}, "memory_high": 2000 * MiB, "memory_max": 3000 * MiB}, 1000 * MiB,
     "50% of the unit's MemoryHigh 2000 MiB"),
    ({"env": {}, "memory_high": None, "memory_max": 3000 * MiB}, 3000 * MiB, "the unit's MemoryMax 3000 MiB"),
    ({"env": {}}, None, "none"),
])
def test_budget_is_where_the_service_would_shed_load_or_die(info, limit, source):
    got, why = t.budget(info)
    assert got == limit and why.startswith(source)


def test_score_is_the_median_time_to_the_whole_answer():
    assert t.score([_run(2.0), _run(1.0), _run(9.0)], 16) == (2.0, "")
    value, why = t.score([_run(1.0), _run(1.0, tokens=3)], 16)
    assert value is None and why == "1 of 2 answers incomplete: 3 tokens instead of 16"
    value, why = t.score([_run(1.0, error="HTTP 503: loading")], 16)
    assert value is None and "HTTP 503: loading" in why
    assert t.score([], 16) == (None, "no answer was timed")


def test_follow_ups_count_in_the_score_and_their_first_token_apart():
    rows = [{**_run(3.0, first=2.0), "turn": 0}, {**_run(1.0, first=0.2), "turn": 1},
            {**_run(3.2, first=2.2), "turn": 0}, {**_run(1.2, first=0.4), "turn": 1}]
    c = t.evaluate("paged", rows, 16, None, None)
    assert c.score_s == 2.1  # the median of all four answers, follow-ups included
    assert (c.first_token_s, c.followup_first_token_s) == (2.1, 0.3)
    assert t.evaluate("paged", rows[::2], 16, None, None).followup_first_token_s is None


def test_an_engine_over_the_budget_loses_to_a_slower_one_within_it():
    fast = t.evaluate("direct", [_run(1.0), _run(1.2)], 16, 900 * MiB, 800 * MiB, 3.0)
    slow = t.evaluate("serial", [_run(2.0), _run(2.2)], 16, 500 * MiB, 800 * MiB, 3.0)
    assert fast.status == t.OVER_BUDGET and "900 MiB is over the budget of 800 MiB" in fast.reason
    assert (slow.status, slow.score_s, slow.first_token_s, slow.ms_per_token) == (t.OK, 2.1, 0.5, 40.0)
    engine, why = t.pick([fast, slow])
    assert engine == "serial" and why == "fastest within budget: 2.1 s to the whole answer"


def test_the_fastest_within_budget_wins_and_a_tie_keeps_the_first():
    serial = t.evaluate("serial", [_run(2.0)], 16, None, None)
    direct = t.evaluate("direct", [_run(1.5)], 16, None, None)
    assert t.pick([serial, direct]) == ("direct", "fastest within budget: 1.5 s to the whole answer (vs serial 2.0 s)")
    twin = t.evaluate("direct", [_run(2.0)], 16, None, None)
    assert t.pick([serial, twin])[0] == "serial"


def test_nothing_within_budget_names_each_reason():
    broken = t.evaluate("serial", [_run(1.0, error="HTTP 500")], 16, None, None)
    big = t.evaluate("direct", [_run(1.0)], 16, 2 * MiB, MiB)
    engine, why = t.pick([broken, big])
    assert engine is None and "serial: 1 of 1 answers incomplete: HTTP 500" in why and "direct: peak RSS" in why


def test_a_pin_wins_even_over_budget_but_not_when_it_fails():
    big = t.evaluate("direct", [_run(1.0)], 16, 2 * MiB, MiB)
    engine, why = t.pick([big], pin="direct")
    assert engine == "direct" and why.startswith("pinned (1.0 s") and "over the budget" in why
    broken = t.evaluate("direct", [_run(1.0, error="boom")], 16, None, None)
    assert t.pick([broken], pin="direct")[0] is None


def test_record_names_the_choice_every_score_the_skips_and_the_cpu():
    cands = [t.evaluate("serial", [_run(2.0), _run(2.4)], 16, 300 * MiB, None, 4.2),
             t.evaluate("direct", [_run(1.0), _run(1.4)], 16, 350 * MiB, None, 5.0)]
    result = t.HostTune("c1", True, "direct", "fastest", cands, {"batching": "why not"})
    rec = t.record(result, False, t.Options(tokens=16, runs=2), (None, "none"),
                   {"model": "Xeon", "flags": "fpu avx2 avx512f avx512_vnni"}, {"release": "r1"}, 61.23,
                   now=dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc))
    assert json.loads(json.dumps(rec)) == rec
    assert (rec["engine"], rec["tokens"], rec["runs"], rec["pinned"], rec["version"]) == ("direct", 16, 2, False, 1)
    assert rec["candidates"]["serial"] == {"status": "ok", "score_s": 2.2, "first_token_s": 0.5, "ms_per_token": 40.0,
                                           "followup_first_token_s": None, "peak_rss_bytes": 300 * MiB,
                                           "ready_s": 4.2, "totals_s": [2.0, 2.4], "reason": ""}
    assert rec["candidates"]["direct"]["score_s"] == 1.2 and rec["skipped"] == {"batching": "why not"}
    assert rec["cpu"]["model"] == "Xeon" and {"avx2", "avx512f", "avx512_vnni"} <= set(rec["cpu"]["isa"])
    assert (rec["time"], rec["seconds"], rec["release"]) == ("2026-01-02T03:04:05+00:00", 61.2, "r1")


# -- host side, unit, status ---------------------------------------------------------------------------------------

def test_agent_records_and_removes_on_local_files(tmp_path):
    path = tmp_path / "etc" / "tuned.json"
    tune.write_record({"path": str(path), "record": {"engine": "direct"}})
    assert json.loads(path.read_text()) == {"engine": "direct"} and path.stat().st_mode & 0o777 == 0o644
    tune.write_record({"path": str(path), "record": None})
    assert not path.exists()
    override = tmp_path / "engine.env"
    override.write_text(tune.override_text("direct"))
    assert layout.read_env(override) == {"VLFLEET_ENGINE": "direct"}


def test_peak_rss_sums_the_high_water_marks_of_the_units_processes(tmp_path):
    cg = tmp_path / "cg" / "system.slice" / "vlfleet.service"
    cg.mkdir(parents=True)
    (cg / "cgroup.procs").write_text("11\n12\n")
    for pid, rss, hwm in (("11", 1000, 2000), ("12", 30000, 50000)):
        (tmp_path / "proc" / pid).mkdir(parents=True)
        (tmp_path / "proc" / pid / "status").write_text(f"Name:\tx\nVmHWM:\t{hwm} kB\nVmRSS:\t{rss} kB\n")
    args = ("/system.slice/vlfleet.service", tmp_path / "cg", tmp_path / "proc")
    assert system.cgroup_rss(*args) == 31000 * 1024
    assert system.cgroup_rss(*args, field="VmHWM:") == 52000 * 1024


def _row(**kw) -> dict:
    row = {"host": "c1", "release": "r1", "serving": "r1", "artifact": "a1", "ready": True, "unit": "active/running",
           "queue_depth": 0, "uptime_s": 5, "rss_bytes": None, "ttft_p50_s": None, "reason": ""}
    return {**row, **kw}


def test_status_shows_the_engine_and_whether_tune_chose_it():
    lines = status_table([_row(engine="direct", tuned_engine="direct"),
                          _row(host="c2", engine="serial", tuned_engine="direct"),
                          _row(host="c3", engine="serial")]).splitlines()
    del lines[1]  # the rule under the header
    assert lines[0].split()[:5] == ["host", "release", "artifact", "engine", "ready"]
    assert lines[1].split()[3] == "direct*"
    assert lines[2].split()[3] == "serial" and lines[2].endswith("`vlfleet tune` chose direct")
    assert lines[3].split()[3] == "serial"
    assert [page._engine(h) for h in ({"engine": "direct", "tuned_engine": "direct"},
                                      {"engine": "serial", "tuned_engine": "direct"}, {"engine": "serial"})] == [
        "direct (tuned)", "serial (tune chose direct)", "serial"]


# -- a fleet run through Fabric -------------------------------------------------------------------------------------

ADDR = {"h1": "10.9.0.11", "h2": "10.9.0.12", "lb1": "10.9.0.10"}


def _answer(payload) -> Command:
    return Command(out=(json.dumps(payload) + "\n").encode())


INFO = _answer({"release": "r1", "env": {"VLFLEET_HOST": "10.9.0.11", "VLFLEET_PORT": "8000"}, "override": None,
                "record": None, "memory_high": 2000 * MiB, "memory_max": 2200 * MiB, "mem_total": 4000 * MiB,
                "llama_server": {"path": "", "exists": False}})
FACTS = _answer({"model": "Test CPU", "flags": "fpu avx2", "env": ""})
QUIESCE = _answer({"left": 0, "waited_s": 0.1})
LB = _answer({"changed": True, "drained": []})


def _up(engine: str) -> Command:
    return _answer({"ok": True, "ready_s": 2.0, "readyz": {"engine": engine}, "engine": engine})


def _latency(total: float) -> Command:
    return _answer([_run(total, tokens=8), _run(total + 0.2, tokens=8)])


def _peak(mib: int) -> Command:
    return _answer({"peak_rss_bytes": mib * MiB, "rss_bytes": mib * MiB, "cgroup_peak_bytes": None})


def _ran(session: Session) -> list[str]:
    out = []
    for ch in session.channels:
        if ch.exec_command.called:
            cmd = ch.exec_command.call_args[0][0]
            probe = next((w for w in ("facts", "latency") if f".pyz {w} " in cmd), None)
            out.append(probe or step_name(cmd))
    return out


def test_fleet_run_measures_picks_records_and_a_failing_host_is_put_back(remote, tmp_path):
    h1 = Session(host=ADDR["h1"], user="deploy", commands=[
        INFO, FACTS, QUIESCE, _up("direct"), _latency(1.0), _peak(400), _up("serial"), _latency(2.0), _peak(300),
        _up("paged"), _latency(1.5), _peak(400), _up("direct"), _answer({"written": True})])
    down = _answer({"ok": False, "reason": "the service exited (failed/failed, exit status 1)", "journal": []})
    h2 = Session(host=ADDR["h2"], user="deploy", commands=[INFO, FACTS, QUIESCE, down, down, down, _up("direct")])
    lb = Session(host=ADDR["lb1"], user="deploy", commands=[LB] * 4)
    remote.expect_sessions(h1, h2, lb)
    hostvars = {h: {"ansible_host": a, "ansible_user": "deploy"} for h, a in ADDR.items()}
    inv = parse_inventory_json({"_meta": {"hostvars": hostvars}, "vlm": {"hosts": ["h1", "h2"]},
                                "lb": {"hosts": ["lb1"]}})
    lines: list[str] = []
    with Fleet(inv, timeouts=Timeouts(drain=5, ready=30), echo=None, ship=False) as fleet:
        results = t.tune(fleet, t.Options(tokens=8, runs=2, parallel=1, out=tmp_path), echo=lines.append)
    ok, failed = results
    assert (ok.ok, ok.engine, failed.ok, failed.engine) == (True, "direct", False, None)
    # direct was measured first and won: the service is restarted on it; the record goes to the host and here
    assert _ran(h1) == ["tune_info", "facts", "quiesce", *["set_engine", "latency", "peak"] * 3, "set_engine",
                        "write_record"]
    assert step_args(h1.channels[-2].exec_command.call_args[0][0])["engine"] == "direct"
    written = step_args(h1.channels[-1].exec_command.call_args[0][0])
    assert written["path"] == contract.TUNED_FILE and written["record"]["engine"] == "direct"
    assert json.loads((tmp_path / "tune-h1.json").read_text()) == written["record"]
    assert written["record"]["candidates"]["serial"]["score_s"] == 2.1
    assert written["record"]["budget_bytes"] == 1600 * MiB
    # h2: every engine failed to start, so it went back to the release's engine (no override: the service's default)
    # and nothing was written
    assert _ran(h2) == ["tune_info", "facts", "quiesce", *["set_engine"] * 4]
    assert step_args(h2.channels[-1].exec_command.call_args[0][0])["engine"] is None
    assert "no engine answered within budget" in failed.message and "back on direct as before" in failed.message
    assert not (tmp_path / "tune-h2.json").exists()
    assert [step_args(ch.exec_command.call_args[0][0])["drain" if i % 2 == 0 else "undrain"]
            for i, ch in enumerate(lb.channels)] == [["h1"], ["h1"], ["h2"], ["h2"]]
    assert any(line.startswith("[tune] h1: direct: ready in 2.0 s; 2 x 8 tokens: 1.1 s") for line in lines)
    assert "[tune] h1: batching: skipped: " + dict(t.plan(None, None, NO_SERVER))["batching"] in lines
    table = t.table(results)
    assert "direct 1.1, serial 2.1, paged 1.6" in table and "direct failed, serial failed, paged failed" in table


@pytest.fixture
def remote():
    mock = MockRemote()
    yield mock
    mock.stop()


def test_clients_make_batching_a_candidate_and_reach_the_probe_with_a_bound_for_the_load(remote, tmp_path):
    assert dict(t.plan(None, None, NO_SERVER, clients=4))["batching"] is None
    h1 = Session(host=ADDR["h1"], user="deploy", commands=[
        INFO, FACTS, QUIESCE, _up("batching"), _latency(2.0), _peak(300), _answer({"written": True})])
    lb = Session(host=ADDR["lb1"], user="deploy", commands=[LB] * 2)
    remote.expect_sessions(h1, lb)
    hostvars = {h: {"ansible_host": ADDR[h], "ansible_user": "deploy"} for h in ("h1", "lb1")}
    inv = parse_inventory_json({"_meta": {"hostvars": hostvars}, "vlm": {"hosts": ["h1"]}, "lb": {"hosts": ["lb1"]}})
    lines: list[str] = []
    opts = t.Options(engines=("batching",), tokens=8, runs=1, clients=3, followups=1, probe_timeout=100, parallel=1,
                     out=tmp_path)
    with Fleet(inv, timeouts=Timeouts(drain=5, ready=30), echo=None, ship=False) as fleet:
        (result,) = t.tune(fleet, opts, echo=lines.append)
    assert result.ok and (result.record["clients"], result.record["followups"]) == (3, 1)
    latency = next(cmd for ch in h1.channels if ".pyz latency " in (cmd := ch.exec_command.call_args[0][0]))
    # each of the 3 answers asked at once may wait for the other two: 3 x the bound of a lone answer; the probe's
    # default picture ('') and one follow-up per conversation
    assert latency.endswith(" 8 1 300 '' 3 '' 1"), latency
    assert any("1 x 3 at once x 8 tokens + 1 follow-up(s) each" in line for line in lines), lines
