"""`vlfleet status`: one row per host (release, artifact, engine and the one `vlfleet tune` chose, ready, queue,
uptime, RSS, first-token p50) and its table."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from ops.fleet.batches import describe_error, format_table
from ops.fleet.inventory import Host
from ops.fleet.prometheus_text import histogram_quantile, info_labels
from ops.fleet.transport import Fleet


def status(fleet: Fleet) -> list[dict]:
    def one(host: Host) -> dict:
        try:
            p = fleet.status(host.name)
        except Exception as e:  # shown in the table
            return {"host": host.name, "error": describe_error(e)[1]}
        ready = p.get("readyz") or {}
        labels = info_labels(p.get("metrics", ""), "vlfleet_model")
        return {
            "host": host.name,
            "release": p.get("release"),
            "serving": ready.get("release_id") or labels.get("release_id"),
            "artifact": ready.get("artifact_id") or labels.get("artifact_id"),
            "engine": ready.get("engine"),
            "tuned_engine": p.get("tuned_engine"),
            "ready": p.get("readyz_status") == 200,
            "unit": "/".join(str(p["unit"].get(k)) for k in ("ActiveState", "SubState")),
            "queue_depth": ready.get("queue_depth"),
            "uptime_s": ready.get("uptime_s"),
            "rss_bytes": p.get("rss_bytes"),
            "ttft_p50_s": histogram_quantile(p.get("metrics", ""), "vlfleet_time_to_first_token_seconds", 0.5),
            "reason": ready.get("reason", ""),
        }

    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(one, fleet.hosts))


def status_table(rows: list[dict]) -> str:
    table = [("host", "release", "artifact", "engine", "ready", "queue", "uptime", "rss", "ttft p50", "notes")]
    for r in rows:
        if "error" in r:
            table.append((r["host"], "?", "?", "?", "unreachable", "-", "-", "-", "-", r["error"]))
            continue
        notes = r["reason"]
        if r["serving"] and r["release"] and r["serving"] != r["release"]:
            notes = f"current -> {r['release']} but the process serves {r['serving']} (restart pending)"
        tuned = r.get("tuned_engine")
        if tuned and r.get("engine") and tuned != r["engine"]:
            notes = f"{notes}; `vlfleet tune` chose {tuned}".lstrip("; ")
        if not r["ready"]:
            notes = f"{r['unit']} {notes}".strip()
        table.append((
            r["host"], r["release"] or "-", (r["artifact"] or "-")[:40], _engine(r), "yes" if r["ready"] else "no",
            "-" if r["queue_depth"] is None else str(r["queue_depth"]),
            "-" if r["uptime_s"] is None else _duration(r["uptime_s"]),
            "-" if not r["rss_bytes"] else f"{r['rss_bytes'] / 2**20:.0f} MiB",
            "-" if r["ttft_p50_s"] is None else f"{r['ttft_p50_s']:.2f}s", notes))
    return format_table(table)


def _engine(row: dict) -> str:
    """The running engine; a star when `vlfleet tune` chose it (the record's engine when the process says none)."""
    engine, tuned = row.get("engine"), row.get("tuned_engine")
    if not engine:
        return f"{tuned}?" if tuned else "-"
    return engine + ("*" if tuned == engine else "")


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"
