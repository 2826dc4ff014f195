"""Reference docs generated from their sources, so they cannot drift:

- docs/configuration.md: the service's VLFLEET_* settings (service/runtime/settings.py FIELDS) and every role's inputs
  (roles/*/meta/argument_specs.yml);
- docs/api.md: the HTTP API (service/http/openapi.py document(), generated from the pydantic models);
- results/ci-timing.md: the wall time of a CI-like run (results/ci-timing.json, written by the suite's own timing
  hooks in tests/budget.py, and results/ci-run.json, written by .ci/run);
- docs/reliability.md: its figures (the `<!-- gen:... -->` spans) from results/e2e/*.json, the reports the fault,
  rollout, security and abuse tests write (reliability.py, e2e_reports.py).

`python -m ops.docs` rewrites them; `python -m ops.docs --check` exits 1 naming the stale files (the unit
tests do the same comparison); `python -m ops.docs --collect [REPORTS_DIR]` first copies the reports of a run
(default: the cache's reports/) into results/e2e/, naming those it did not find.
"""
