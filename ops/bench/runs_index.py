"""results/README.md's table of bench runs, generated from each run's bench.json (what ran, where, under which load).

Only the table between the markers is rewritten by `python -m ops.docs`; the prose around it (what changed
before each run, how to read them) stays hand-written and carries no figures.
"""

from __future__ import annotations

from pathlib import Path

from ops.bench.bench_md import table
from ops.bench.targets import dig
from ops.bench.tuning_page import cpu_class, load_runs

BEGIN, END = "<!-- runs:begin -->", "<!-- runs:end -->"
README = Path("results") / "README.md"


def _bandwidth(results: dict) -> str:
    bw = dig(results, "machine_limit", "bandwidth", "all_threads")
    return f"{bw / 1e9:.1f} GB/s" if bw else ""


def rows(results_dir: Path) -> list[list[str]]:
    out = []
    for path, r in load_runs(results_dir):
        meta = r.get("meta") or {}
        link = path.removeprefix("results/")
        name = str(Path(link).parent)
        out.append([f"[{'results/' if name == '.' else name}]({link.replace('.json', '.md')})",
                    meta.get("started", ""), cpu_class(r), ", ".join(meta.get("sections") or []),
                    str(meta.get("runs", "")), str(meta.get("tokens", "")),
                    str(dig(meta, "machine", "loadavg") or ""), _bandwidth(r)])
    return out


def render(root: Path) -> str:
    """results/README.md with its runs table regenerated from the bench.json files under results/."""
    text = (root / README).read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    body = table(["run", "started", "CPU (ISA)", "sections", "runs", "tokens", "load at start",
                  "read bandwidth"], rows(root / "results"))
    return f"{head}{BEGIN}\n{body}\n{END}{tail}"
