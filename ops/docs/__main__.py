"""`python -m ops.docs`: regenerate the generated docs, check them, or first collect a run's e2e reports."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import ops.docs
from ops.docs import e2e_reports, generate
from ops.paths import cache_root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.docs", description=ops.docs.__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report stale files (exit 1 if any)")
    parser.add_argument("--collect", nargs="?", const="", metavar="REPORTS_DIR",
                        help="first copy the reliability reports from REPORTS_DIR (default: $VLFLEET_CACHE/reports) "
                             "into results/e2e/; exit 1 if any expected report was missing (the docs are still "
                             "regenerated from what results/e2e/ then holds)")
    args = parser.parse_args(argv)
    missing = False
    if args.collect is not None:  # "" when given without a directory
        missing = _collect(Path(args.collect) if args.collect else cache_root() / "reports")
    if args.check:
        old = generate.stale()
        for path in old:
            print(f"stale: {path} (run `python -m ops.docs`)")
        return 1 if old else 0
    for path, render in generate.targets().items():
        path.write_text(render())
        print(f"wrote {path}")
    return 1 if missing else 0


def _collect(source: Path) -> bool:
    """Copy a run's reports into results/e2e/ and say what was copied and what is missing; True if any is."""
    if not source.is_dir():
        raise SystemExit(f"--collect: {source} is not a directory (a cache's reports/, e.g. "
                         "~/.cache/vlfleet/reports or $VLFLEET_CACHE/reports)")
    result = e2e_reports.collect(source)
    for line in e2e_reports.summary(result, source):
        print(line)
    return bool(result.missing or result.unreadable)


if __name__ == "__main__":
    sys.exit(main())
