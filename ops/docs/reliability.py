"""docs/reliability.md's figures, generated from results/e2e/*.json (ops/e2e_reports.py).

The prose stays hand-written; every measured figure sits in a span `<!-- gen:NAME -->...<!-- /gen -->` that
`python -m ops.docs` rewrites from the report NAME (before a colon) names. A span whose report was never
collected says so instead of showing a figure. Spans are inline, inside table rows, so rows without figures can be
added by hand without touching this module.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from ops.docs import e2e_reports
from ops.paths import repo_root

DOC = Path("docs") / "reliability.md"
SPAN = re.compile(r"(?P<open><!-- gen:(?P<name>[a-z0-9][a-z0-9:-]*) -->)(?P<body>.*?)(?P<close><!-- /gen -->)", re.S)


def _code(text: object) -> str:
    """Inline code in a table cell: one line, no pipes, no backticks that would end it."""
    return "`" + " ".join(str(text).split()).replace("`", "'").replace("|", "\\|") + "`"


def _s(seconds: float) -> str:
    return f"{seconds:.1f} s"


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.0f} ms"


def _load(d: dict) -> str:
    """What the clients going through nginx saw during a rollout (tests/e2e/test_rollout.py Load.summary)."""
    return (f"{d['requests']} requests ({d['streamed']} streamed), **{d['failures']} failed**; first token p50 "
            f"{_ms(d['p50_first_token_s'])}, p95 {_ms(d['p95_first_token_s'])}")


def _answers(answers: dict[str, list]) -> str:
    return ", ".join(f"{name} {status}" + (f" `{code}`" if code else "") for name, (status, code) in answers.items())


# One renderer per report, prose around its figures: alike in shape by design, no logic repeated.
def _hostile(d: dict) -> str:
    rss = ", ".join(map(str, d["rss_mib"]))
    return (f"the same answer in each of {d['rounds']} rounds: {_answers(d['answers'])}; RSS after each round "
            f"{rss} MiB (rounds after the first asserted within {d['growth_margin_mib']} MiB of it: allocator "
            "noise and the KV-cache pool, which grows in steps as the prefix cache keeps blocks)")


def _overflow(d: dict) -> str:
    return (f"{d['burst']} requests at once on a queue of {d['queue']} with one long request running: "
            f"{d['refused_429']} refused with 429 + `Retry-After`, {d['completed_200']} completed (the running one "
            f"included; 200, every token); peak RSS **{d['peak_rss_mib']} MiB** against a {d['memory_limit_mib']} MiB "
            "`VLFLEET_MEMORY_LIMIT_MB`; queue depth back to 0")


def _stalled(d: dict) -> str:
    return (f"a {d['stream_tokens']}-token stream asked on a {d['rcvbuf_bytes']}-byte receive buffer: the server's "
            f"send queue to it filled ({d['send_queue_bytes']} bytes of Send-Q, asserted over "
            f"{d['send_queue_over_bytes']}) while its generation ran to the end ({d['generated_tokens']} tokens) into "
            f"the job's own event queue; {d['others_answered']} other users answered meanwhile, `/readyz` 200, queue "
            "depth 0; when the client closed, the connection was dropped")


def _disconnects(d: dict) -> str:
    return (f"{d['clients']} clients that hang up after their first token, plus one patient user: {d['hung_up']} hung "
            f"up, `vlfleet_cancelled_requests_total` +{d['cancelled']}, the patient user answered, queue depth 0, "
            "in-flight back to the scrape alone, the next request answered")


def _host_down(d: dict) -> str:
    return (f"the canary ok; {d['host']} went down while its step ran and is reported `{d['outcome']}` with the "
            f"reason {_code(d['message'])}; the rollout stopped ({_code(d['stopped'])}); the hosts after it skipped "
            f"and unchanged; rollout {_s(d['rollout_s'])}")


# span name -> its text from the report the name starts with (the part before a colon)
SPANS: dict[str, Callable[[dict], str]] = {
    "faults-kill9": lambda d: f"new main PID after {_s(d['new_pid_after_s'])}, `/readyz` 200 after "
                              f"**{_s(d['ready_after_s'])}** on {d['host']} (bound asserted: {d['bound_s']} s)",
    "faults-vm-reboot": lambda d: f"{d['host']}: SSH back **{_s(d['ssh_after_s'])}**, `/readyz` 200 "
                                  f"**{_s(d['ready_after_s'])}** after the reboot; checklist failures: "
                                  + (", ".join(d["checklist_failed"]) or "none"),
    "faults-host-down-mid-rollout:happened": _host_down,
    "faults-host-down-mid-rollout": lambda d: f"{d['host']} powered on: serving again "
                                              f"**{_s(d['serving_again_after_power_on_s'])}** after the power-on",
    "faults-corrupt-artifact:lb": lambda d: f"{d['lb_statuses'].count(200)}/{len(d['lb_statuses'])}",
    "faults-corrupt-artifact": lambda d: f"refusal in the journal **{_s(d['refused_after_s'])}** after the file was "
                                         f"truncated and the service restarted; the checklist: {_code(d['checklist'])}",
    "faults-disk-full-convert": lambda d: f"after **{_s(d['seconds'])}** the convert exits {d['exit']}, its last line "
                                          f"{_code(d['last_line'])}",
    "affinity-drain-e2e": lambda d: f"{d['drained']} drained: its {d['moved']} of {d['conversations']} "
                                    f"conversations went on elsewhere and came back after the undrain, the others "
                                    f"never moved; {d['requests']} requests, **{d['failures']} failed**",
    "affinity-kill-e2e": lambda d: f"{d['killed']} killed: its {d['moved']} of {d['conversations']} conversations "
                                   f"went on elsewhere at once and came back once it was ready; {d['requests']} "
                                   f"requests, **{d['failures']} failed**",
    "rollout-e2e": lambda d: f"all {d['hosts']} service hosts on the new release in **{_s(d['rollout_s'])}**",
    "rollout-e2e:load": _load,
    "rollout-bad-e2e": lambda d: f"stopped after **{_s(d['rollout_s'])}**",
    "rollout-bad-e2e:load": _load,
    "rollback-e2e": lambda d: f"every host back on the first release in **{_s(d['rollback_s'])}**",
    "rollback-e2e:load": _load,
    "security-exposure": lambda d: ", ".join(f"**{level}** on {host}" for host, level in sorted(d["levels"].items()))
                                   + f" (limit {d['limit']})",
    "slow-client-stalled": _stalled,
    "slow-client-disconnects": _disconnects,
    "hostile-images-rss": _hostile,
    "queue-overflow-rss": _overflow,
}


def _sources(reports: dict[str, dict], written: dict[str, str]) -> str:
    """The table of reports: which test writes each, and when the collected copy was written."""
    rows = ["| report | written by | written |", "|---|---|---|"]
    for name, test in e2e_reports.REPORTS.items():
        when = written.get(name, "unknown") if name in reports else "not collected yet"
        link = f"[{name}.json](../results/e2e/{name}.json)" if name in reports else f"{name}.json"
        rows.append(f"| {link} | `{test}` | {when} |")
    return "\n" + "\n".join(rows) + "\n"


def span(name: str, reports: dict[str, dict]) -> str:
    report = name.split(":")[0]
    if report not in reports:
        return f"not measured: no results/e2e/{report}.json collected yet"
    return SPANS[name](reports[report])


def render(root: Path | None = None) -> str:
    """The doc as it is, with every span rewritten from results/e2e/. Unknown or missing spans are errors, so a
    figure cannot silently stop being generated."""
    root = root or repo_root()
    path = root / DOC
    reports, written = e2e_reports.load(root), e2e_reports.written(root)
    seen: list[str] = []

    def fill(m: re.Match) -> str:
        name = m["name"]
        if name != "sources" and name not in SPANS:
            raise ValueError(f"{path}: unknown generated span {name!r} (known: {', '.join(SPANS)}, sources)")
        seen.append(name)
        body = _sources(reports, written) if name == "sources" else span(name, reports)
        return m["open"] + body + m["close"]

    text = SPAN.sub(fill, path.read_text())
    lost = sorted({*SPANS, "sources"} - set(seen))
    if lost:
        raise ValueError(f"{path}: generated span(s) missing: {', '.join(lost)}; put them back (see {__name__})")
    return text
