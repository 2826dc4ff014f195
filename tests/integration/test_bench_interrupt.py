"""An interrupted bench (SIGTERM, as Ctrl-C) stops promptly, stops every process it started and keeps what it measured.

The suite runs the int4 section on the tiny model with far more runs than it will finish; SIGTERM arrives once the
service answers. Before the fix, SIGTERM killed the bench at once and left its service running.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.servers import wait_for

DRIVER = """
import sys
from pathlib import Path
from ops.bench.suite import Plan, run
from service.runtime.processes import sigterm_as_interrupt

artifact, out = Path(sys.argv[1]), Path(sys.argv[2])
(out / "logs").mkdir(parents=True)
plan = Plan(sections=("int4",), runs=10_000, tokens=8, out=out, log_dir=out / "logs")
try:
    with sigterm_as_interrupt():
        run(plan, lambda fmt: artifact, lambda: None)
except KeyboardInterrupt:
    sys.exit(130)
"""


def test_sigterm_stops_the_bench_and_its_service_and_keeps_the_results(tiny_model: Path, tmp_path):
    out = tmp_path / "results"
    log = tmp_path / "bench.log"
    with open(log, "w") as f:
        bench = subprocess.Popen([sys.executable, "-c", DRIVER, str(tiny_model), str(out)], stdout=f,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: "int4 ready" in log.read_text() or bench.poll() is not None, 300,
                 "the bench's service to be ready", interval=0.5)
        assert bench.poll() is None, log.read_text()[-2000:]
        time.sleep(2)  # answers are being measured
        started = psutil.Process(bench.pid).children(recursive=True)
        assert started, "the bench started no service"
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=90) == 130, log.read_text()[-2000:]
    finally:
        if bench.poll() is None:
            bench.kill()
    alive = [p.pid for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"left running: {alive}"
    results = json.loads((out / "bench.json").read_text())
    assert results["meta"]["interrupted_in"] == "int4"
    assert results["service"]["int4"]["cold_start_s"] > 0  # measured before the interrupt, kept
    assert "**Interrupted** in section `int4`" in (out / "bench.md").read_text()
