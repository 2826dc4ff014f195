"""PNG charts for benchmark results (matplotlib, no display)."""

from __future__ import annotations

from pathlib import Path

from ops.bench.stats import lever_defaults


def bar_chart(path: Path, title: str, groups: dict[str, list[float | None]], series: list[str]) -> Path:
    """Grouped bars, one per series in each group; None is a series not measured in that group (no bar, no label)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(series)
    for i, name in enumerate(series):
        xs = [g + i * width for g in range(len(groups))]
        values = [vals[i] for vals in groups.values()]
        bars = ax.bar(xs, [v or 0.0 for v in values], width, label=name)
        ax.bar_label(bars, labels=["" if v is None else f"{v:.2f}" for v in values], fontsize=8)
    ax.set_xticks([g + width * (len(series) - 1) / 2 for g in range(len(groups))], list(groups))
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def bars(path: Path, title: str, values: dict[str, float], ylabel: str, line: float | None = None,
         line_label: str = "") -> Path:
    """One bar per label; ``line`` draws a horizontal reference (a floor, a threshold)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    bars_ = ax.bar(list(values), list(values.values()), color="#4c72b0")
    ax.bar_label(bars_, fmt="%.2f", fontsize=8)
    if line is not None:
        ax.axhline(line, color="#c44e52", linestyle="--", label=line_label)
        ax.legend()
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def lever_chart(path: Path, levers: list[dict]) -> Path:
    """Each lever's first token and ms/token as ratios to the service defaults (1.0 = no effect; lower is faster),
    one row per setting: the settings' names are too long for a bar chart's x axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = lever_defaults(levers)
    rows = [lv for lv in levers if lv["name"] != "baseline"]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
    for i, (key, label) in enumerate((("ms_per_token", "ms/token"), ("first_token_s", "first token"))):
        ys = [r + i * 0.4 for r in range(len(rows))]
        bars_ = ax.barh(ys, [lv[key] / base[key] for lv in rows], 0.4, label=label)
        ax.bar_label(bars_, fmt="%.2fx", fontsize=7)
    ax.set_yticks([r + 0.2 for r in range(len(rows))], [lv["setting"] for lv in rows], fontsize=7)
    ax.invert_yaxis()
    ax.axvline(1.0, color="#c44e52", linestyle="--", linewidth=1)
    ax.set_xlabel("ratio to the service defaults (lower is faster)")
    ax.set_title("Levers (A/B, int4)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def suite_charts(results: dict, out_dir: Path) -> list[str]:
    """The bench's PNGs (file names relative to ``out_dir``) for what this run measured."""
    from ops.bench.targets import dig

    made: list[str] = []
    runtimes = {f"transformers {k}": dig(results, "baselines", k) for k in ("fp32", "bf16")}
    runtimes |= {f"service {k}": dig(results, "service", k, "image_416") for k in ("int8", "int4")}
    runtimes["llama-server"] = dig(results, "peer", "image_416")
    runtimes = {k: v for k, v in runtimes.items() if v}
    if runtimes:
        bars(out_dir / "bench-first-token.png", "Time to first token, 416x277 image",
             {k: v["first_token_s"] for k, v in runtimes.items()}, "seconds")
        floor = dig(results, "machine_limit", "floor_ms_per_token", "int4")
        bars(out_dir / "bench-ms-per-token.png", "ms per output token (decode)",
             {k: v["ms_per_token"] for k, v in runtimes.items()}, "ms/token", floor, "int4 bandwidth floor")
        made += ["bench-first-token.png", "bench-ms-per-token.png"]
        rss = {k: dig(results, "baselines", k.split()[-1], "peak_rss_bytes") for k in runtimes if "transformers" in k}
        rss |= {k: dig(results, "service", k.split()[-1], "peak_rss_bytes") for k in runtimes if "service" in k}
        rss["llama-server"] = dig(results, "peer", "peak_rss_bytes")
        rss = {k: v / 1e9 for k, v in rss.items() if v}
        if rss:
            bars(out_dir / "bench-peak-rss.png", "Peak RSS of the process holding the model", rss, "GB")
            made.append("bench-peak-rss.png")
    images = dig(results, "service", "int4", "images")
    if images:
        bars(out_dir / "bench-images.png", "First token by image size (int4 service)",
             {k: v["first_token_s"] for k, v in images.items()}, "seconds")
        made.append("bench-images.png")
    conc = results.get("concurrency")
    if conc:
        groups = {}
        engines = list(conc)
        for i, levels in enumerate(conc.values()):
            for lv in levels:
                groups.setdefault(f"{lv['clients']} clients", [0.0] * len(engines))[i] = lv["tokens_per_s"]
        bar_chart(out_dir / "bench-concurrency.png", "Aggregate output tokens/s (int4)", groups, engines)
        made.append("bench-concurrency.png")
    tunes = {f"{t.get('clients') or 1} at once": t for t in (results.get(k) for k in ("tune", "tune_load")) if t}
    engines = list(dict.fromkeys(e for t in tunes.values() for e in t.get("candidates") or {}))
    if engines:
        # one group per load: each engine's median time to the whole answer (None where not measured at that load)
        groups = {label: [((t.get("candidates") or {}).get(e) or {}).get("score_s") for e in engines]
                  for label, t in tunes.items()}
        tokens = next(iter(tunes.values())).get("tokens")
        bar_chart(out_dir / "bench-tune.png", f"vlfleet tune: seconds to a whole {tokens}-token answer", groups,
                  engines)
        made.append("bench-tune.png")
    levers = results.get("levers")
    if levers and any(lv["name"] == "baseline" for lv in levers):
        lever_chart(out_dir / "bench-levers.png", levers)
        made.append("bench-levers.png")
    return made
