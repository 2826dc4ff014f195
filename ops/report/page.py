"""The fleet report's charts (PNG, matplotlib) and its one self-contained HTML page (inline CSS, charts embedded as
base64 data URIs, no script, no network): readable from a mail attachment or an artifact store as is."""

from __future__ import annotations

import base64
import html
import statistics
from pathlib import Path
from typing import Any

STATUS_CLASS = {"pass": "pass", "fail": "fail", "waived": "waived", "n/a": "na", "blocked": "blocked"}
CHARTS = {"first_token": ("first_token_s", "First token (s)", "first_token.png"),
          "ms_per_token": ("ms_per_token", "Decode (ms per token)", "ms_per_token.png")}

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1d2430;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde3ea;padding-bottom:4px}
.meta{color:#5b6675;font-size:12px}.cards{display:flex;gap:12px;flex-wrap:wrap;margin:14px 0}
.card{border:1px solid #dde3ea;border-radius:6px;padding:8px 14px;min-width:120px}
.card b{display:block;font-size:20px}.card.bad b{color:#b42318}.card.good b{color:#127a3e}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #dde3ea;padding:4px 8px;text-align:left}
th{background:#f4f6f9}td.num{text-align:right;font-variant-numeric:tabular-nums}
.matrix th.check{writing-mode:vertical-rl;transform:rotate(180deg);font-weight:600;font-size:11px;padding:6px 3px}
.matrix td.cell{text-align:center;font-size:11px;font-weight:600;min-width:34px;cursor:help}
.pass{background:#d9f2e3;color:#12633a}.fail{background:#fbd9d6;color:#9b1c13}.warn{background:#fdecc8;color:#8a5300}
.waived{background:#e7e3f8;color:#4b3a99}.na{background:#eef0f3;color:#6b7480}.blocked{background:#f3e2d3;color:#7a4a1d}
.missing{background:#fff;color:#aab}.charts{display:flex;gap:16px;flex-wrap:wrap}.charts img{max-width:560px;
border:1px solid #dde3ea;border-radius:6px}.callout{background:#fff6e5;border-left:4px solid #e39b00;padding:8px 12px}
.err{color:#b42318}code{background:#f4f6f9;padding:0 3px;border-radius:3px}ul.findings li{margin-bottom:6px}
.isa{font-family:ui-monospace,monospace;font-size:12px}
"""


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 or n == 0 else f"{n / 2**20:.0f} MiB"


def _cpus(cpus: list[int] | None) -> str:
    if not cpus:
        return "?"
    # [0, 1, 2, 5] -> "0-2,5", the kernel's CPU list syntax
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def write_charts(data: dict[str, Any], out: Path) -> dict[str, Path]:
    """One bar chart per probe metric across the fleet, slowest first, outliers in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outliers = {(s["host"], s["metric"]) for s in data["slowest"] if s["outlier"]}
    written: dict[str, Path] = {}
    for key, (metric, title, filename) in CHARTS.items():
        values = {h["name"]: h["probe"][metric] for h in data["hosts"]
                  if (h.get("probe") or {}).get(metric) is not None}
        failed = [h["name"] for h in data["hosts"] if h["name"] not in values]
        fig, ax = plt.subplots(figsize=(6.4, 0.9 + 0.42 * max(1, len(values) + len(failed))))
        order = sorted(values, key=values.__getitem__)
        colors = ["#c0392b" if (n, metric) in outliers else "#4c72b0" for n in order]
        bars = ax.barh(order, [values[n] for n in order], color=colors)
        ax.bar_label(bars, fmt="%.3g", fontsize=8, padding=3)
        for name in failed:
            ax.barh([name], [0])
            ax.text(0, name, "  no answer", va="center", fontsize=8, color="#b42318")
        if values:
            median = statistics.median(values.values())
            ax.axvline(median, color="#888", linestyle="--", linewidth=1, label="fleet median")
            ax.legend(loc="lower right", fontsize=8)
            ax.set_xlim(0, max(values.values()) * 1.25)
        ax.set_title(f"{title}, {data['probe']['tokens']} tokens, median of {data['probe']['runs']} runs", fontsize=10)
        ax.tick_params(labelsize=9)
        fig.tight_layout()
        path = out / filename
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written[key] = path
    return written


def _checklist_section(checklist: dict | None, hosts: list[str]) -> str:
    esc = html.escape
    if checklist is None:
        return "<h2>Pre-launch checklist</h2><p>Not run (<code>--no-checklist</code>).</p>"
    checks = checklist.get("checks", [])
    by_cell = {(r["host"], r["id"]): r for r in checklist.get("results", [])}
    remediation = {c["id"]: "" for c in checks}
    from ops.preflight import registry

    for c in checks:
        try:
            remediation[c["id"]] = registry.get(c["id"]).remediation
        except KeyError:
            remediation[c["id"]] = ""
    parts = ["<h2>Pre-launch checklist</h2>",
             "<p class='meta'>Hover a cell for what was found and the fix; failures are listed below with their "
             "remediation. Every check id is explained in <code>docs/checklist.md</code>.</p>",
             "<table class='matrix' id='checklist-matrix'><thead><tr><th>host</th>"]
    parts += [f"<th class='check' title='{esc(c['description'])}'>{esc(c['id'])}</th>" for c in checks]
    parts.append("</tr></thead><tbody>")
    for host in hosts:
        parts.append(f"<tr class='host-row' data-host='{esc(host)}'><th>{esc(host)}</th>")
        for c in checks:
            r = by_cell.get((host, c["id"]))
            if r is None:
                parts.append("<td class='cell missing' title='not run'>&middot;</td>")
                continue
            cls = STATUS_CLASS.get(r["status"], "na")
            label = {"pass": "ok", "n/a": "n/a", "blocked": "blk", "waived": "wvd"}.get(r["status"], "")
            if r["status"] == "fail":
                cls, label = ("fail", "FAIL") if c["severity"] == "error" else ("warn", "WARN")
            tip = f"{c['id']} on {host}: {r['status']}. {r.get('message', '')}"
            if r["status"] in ("fail", "waived") and remediation.get(c["id"]):
                tip += f"\nFix: {remediation[c['id']]}"
            parts.append(f"<td class='cell {cls}' data-status='{esc(r['status'])}' title='{esc(tip)}'>{label}</td>")
        parts.append("</tr>")
    parts.append("</tbody></table>")
    findings = [r for r in checklist.get("results", []) if r["status"] in ("fail", "waived")]
    if findings:
        parts.append("<h3>Findings and fixes</h3><ul class='findings'>")
        for r in findings:
            parts.append(f"<li><b>{esc(r['host'])}</b> <code>{esc(r['id'])}</code> ({esc(r['status'])}, "
                         f"{esc(r.get('severity', ''))}): {esc(r.get('message', ''))}<br><i>Fix:</i> "
                         f"{esc(remediation.get(r['id'], ''))}</li>")
        parts.append("</ul>")
    for err in checklist.get("run_errors", []):
        parts.append(f"<p class='err'>{esc(err)}</p>")
    return "".join(parts)


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def _locality_section(hosts: list[dict[str, Any]]) -> str:
    """Per host, what its caches saved since the service started: low ratios on a fleet whose clients return
    mean their requests miss the host that holds them (docs/operations.md, "Routing")."""
    rows = []
    for h in hosts:
        loc = h.get("locality")
        if h.get("error") or not loc:
            continue
        rows.append(f"<tr data-host='{html.escape(h['name'])}'><th>{html.escape(h['name'])}</th>"
                    f"<td class='num'>{_ratio(loc['answer_cache_hit_ratio'])} ({loc['answer_cache_hits']})</td>"
                    f"<td class='num'>{_ratio(loc['image_kept_ratio'])} ({loc['vision_encoder_runs']} runs for "
                    f"{loc['prompt_images']} images)</td>"
                    f"<td class='num'>{_ratio(loc['prompt_tokens_reused_ratio'])}</td>"
                    f"<td class='num'>{loc['conversations_continued']}</td></tr>")
    if not rows:
        return ""
    return ("<h2>Cache locality</h2><p class='meta'>Since each service started, from its /metrics. The load "
            "balancer sends a conversation to the host that holds it; ratios near zero on a fleet whose users "
            "return mean it does not.</p><table id='locality'><thead><tr><th>host</th><th>answer cache hits</th>"
            "<th>prompt images not encoded again</th><th>prompt tokens with kept KV</th>"
            "<th>conversations continued</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def _engine(host: dict[str, Any]) -> str:
    """The running engine, and whether it is the one `vlfleet tune` chose on the host."""
    engine, tuned = host.get("engine"), host.get("tuned_engine")
    if not tuned:
        return engine or "?"
    return f"{engine or '?'} (tuned)" if engine == tuned else f"{engine or '?'} (tune chose {tuned})"


def render(data: dict[str, Any], out: Path) -> str:
    esc = html.escape
    hosts = data["hosts"]
    names = [h["name"] for h in hosts]
    ready = sum(1 for h in hosts if h.get("ready"))
    checklist = data.get("checklist")
    blocking = sum(1 for r in (checklist or {}).get("results", [])
                   if r["status"] == "fail" and r.get("severity") == "error")
    parts = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
             "<meta name='viewport' content='width=device-width, initial-scale=1'>",
             f"<title>vlfleet fleet report ({len(hosts)} hosts)</title><style>{CSS}</style></head><body>",
             "<h1>vlfleet fleet report</h1>",
             f"<div class='meta'>{esc(data['generated_at'])} &middot; inventory <code>{esc(data['inventory'])}</code>"
             "</div><div class='cards'>",
             f"<div class='card'><b>{len(hosts)}</b>service hosts</div>",
             f"<div class='card {'good' if ready == len(hosts) else 'bad'}'><b>{ready}/{len(hosts)}</b>ready</div>"]
    if checklist is not None:
        parts.append(f"<div class='card {'bad' if blocking else 'good'}'><b>{blocking}</b>blocking findings</div>")
    parts.append("</div>")
    slow = data["slowest"]
    if slow:
        items = []
        for s in slow:
            unit = "s" if s["metric"] == "first_token_s" else "ms"
            tag = f"{s['ratio']}x the fleet median" + (" (outlier)" if s["outlier"] else "")
            items.append(f"<li id='slowest-{esc(s['host'])}-{esc(s['metric'])}'><b>{esc(s['host'])}</b>: "
                         f"{esc(s['label'])} {s['value']:.3g} {unit}, {tag}</li>")
        parts.append("<div class='callout'><b>Slowest hosts</b><ul>" + "".join(items) + "</ul></div>")
    parts.append("<h2>Probe: first token and decode speed</h2><div class='charts'>")
    for key, filename in data.get("charts", {}).items():
        raw = (out / filename).read_bytes()
        parts.append(f"<img class='chart' id='chart-{esc(key)}' alt='{esc(CHARTS[key][1])} per host' "
                     f"src='data:image/png;base64,{base64.b64encode(raw).decode()}'>")
    parts.append("</div>")
    parts.append("<h2>Hosts</h2><table id='hosts'><thead><tr><th>host</th><th>ready</th><th>release</th>"
                 "<th>artifact</th><th>engine</th><th>CPU</th><th>ISA</th><th>CPUs / pinned</th>"
                 "<th>memory (avail / total)</th>"
                 "<th>swap (used / total)</th><th>RSS</th><th>first token</th><th>ms/token</th></tr></thead><tbody>")
    for h in hosts:
        if h.get("error"):
            parts.append(f"<tr data-host='{esc(h['name'])}'><th>{esc(h['name'])}</th>"
                         f"<td colspan='12' class='err'>{esc(h['error'])}</td></tr>")
            continue
        p = h.get("probe") or {}
        state = "yes" if h.get("ready") else f"no: {h.get('ready_reason') or h.get('unit')}"
        pinned = h.get("pinned_cpus")
        cores = f"{h.get('cpus') or '?'} / " + (_cpus(pinned) if pinned else "not pinned")
        if h.get("threads"):
            cores += f" ({h['threads']} threads)"
        ttft = "" if p.get("first_token_s") is None else f"{p['first_token_s']:.3f} s"
        if p.get("error"):
            ttft += f" <span class='err' title='{esc(p['error'])}'>(errors)</span>"
        mspt = "" if p.get("ms_per_token") is None else f"{p['ms_per_token']:.1f}"
        swap = ("none" if h.get("swap_total_bytes") == 0 else
                f"{_fmt_bytes(h.get('swap_used_bytes'))} / {_fmt_bytes(h.get('swap_total_bytes'))}")
        parts.append(
            f"<tr data-host='{esc(h['name'])}'><th>{esc(h['name'])}</th><td>{esc(state)}</td>"
            f"<td>{esc(str(h.get('release_id') or h.get('release') or '?'))}</td>"
            f"<td><code>{esc(str(h.get('artifact_id') or '?'))}</code></td><td>{esc(_engine(h))}</td>"
            f"<td>{esc(str(h.get('cpu_model') or '?'))}<br><span class='meta'>{esc(str(h.get('os') or ''))}</span></td>"
            f"<td class='isa'>{esc(' '.join(h.get('isa') or []) or 'none')}</td><td>{esc(cores)}</td>"
            f"<td class='num'>{_fmt_bytes(h.get('mem_available_bytes'))} / {_fmt_bytes(h.get('mem_total_bytes'))}</td>"
            f"<td class='num'>{swap}</td>"
            f"<td class='num'>{_fmt_bytes(h.get('rss_bytes'))}</td><td class='num'>{ttft}</td>"
            f"<td class='num'>{mspt}</td></tr>")
    parts.append("</tbody></table>")
    parts.append(_locality_section(hosts))
    parts.append(_checklist_section(checklist, names))
    parts.append("<p class='meta'>Data: <code>report.json</code> beside this page. Made by <code>vlfleet report</code>."
                 "</p></body></html>")
    return "\n".join(parts) + "\n"
