"""PNG charts for benchmark results (matplotlib, no display)."""

from __future__ import annotations

from pathlib import Path


def bar_chart(path: Path, title: str, groups: dict[str, list[float]], series: list[str]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(series)
    for i, name in enumerate(series):
        xs = [g + i * width for g in range(len(groups))]
        values = [vals[i] for vals in groups.values()]
        bars = ax.bar(xs, values, width, label=name)
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
    ax.set_xticks([g + width * (len(series) - 1) / 2 for g in range(len(groups))], list(groups))
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
