"""The pre-launch checklist: testinfra checks with stable ids, severities and remediations (issue 6).

registry.py (the checks), test_checklist.py (their testinfra implementation), plugin.py + conftest.py (pytest glue:
n/a, blocked, waivers, reports, exit code), waivers.py, results.py (table, JSON, JUnit), runner.py (the fleet run
behind `vlfleet preflight` and the preflight role).
"""
