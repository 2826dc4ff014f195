"""Waivers: --ignore, the waivers file's validation, host scoping, expiry."""

from __future__ import annotations

import datetime as dt

import pytest

from ops.preflight import waivers

TODAY = dt.date(2026, 11, 29)


def _file(tmp_path, text: str):
    path = tmp_path / "waivers.yml"
    path.write_text(text)
    return path


def test_ignore_waives_on_every_host_without_expiry():
    ws = waivers.build(None, "cpu-avx512, CLOCK-SYNC", TODAY)
    assert [w.id for w in ws.active] == ["CPU-AVX512", "CLOCK-SYNC"]
    assert ws.find("CPU-AVX512", "any-host") is not None and ws.expired == []


def test_ignore_rejects_unknown_id():
    with pytest.raises(waivers.WaiverError, match="--ignore: unknown check id 'SWAP'"):
        waivers.build(None, "SWAP", TODAY)


def test_file_entries_scoped_to_hosts_and_split_by_expiry(tmp_path):
    path = _file(tmp_path, """
- id: CLOCK-SYNC
  reason: staging VMs reach no NTP server
  expires: 2027-01-31
  hosts: [vm1]
- id: SVC-NOFILE
  reason: container host caps open files
  expires: 2026-11-28
""")
    ws = waivers.build(path, None, TODAY)
    assert ws.find("CLOCK-SYNC", "vm1").reason == "staging VMs reach no NTP server"
    assert ws.find("CLOCK-SYNC", "c1") is None
    assert ws.find("SVC-NOFILE", "c1") is None  # expired: not applied
    assert ws.expired_for("SVC-NOFILE", "c1").expires == dt.date(2026, 11, 28)
    (error,) = ws.errors()
    assert "waiver for SVC-NOFILE expired on 2026-11-28" in error and "renew" in error


def test_waiver_valid_through_its_expiry_day(tmp_path):
    path = _file(tmp_path, "- {id: CLOCK-SYNC, reason: r, expires: 2026-11-29}\n")
    assert waivers.build(path, None, TODAY).errors() == []


@pytest.mark.parametrize(("text", "message"), [
    ("- {id: CLOCK-SYNC, expires: 2027-01-01}", "needs a reason"),
    ("- {id: CLOCK-SYNC, reason: r}", "`expires` must be a date"),
    ("- {id: CLOCK-SYNC, reason: r, expires: soon}", "`expires` must be a date"),
    ("- {id: NO-SUCH, reason: r, expires: 2027-01-01}", "unknown check id 'NO-SUCH'"),
    ("- {id: CLOCK-SYNC, reason: r, expires: 2027-01-01, until: x}", "unknown key"),
    ("id: CLOCK-SYNC", "expected a list"),
    ("- [unbalanced", "not valid YAML"),
])
def test_bad_files_say_which_entry_and_what_to_fix(tmp_path, text, message):
    with pytest.raises(waivers.WaiverError, match=message):
        waivers.build(_file(tmp_path, text), None, TODAY)


def test_empty_file_is_no_waivers(tmp_path):
    assert waivers.build(_file(tmp_path, ""), None, TODAY).active == []
