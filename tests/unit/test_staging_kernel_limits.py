"""Controller kernel limits for container hosts: raised when low, never lowered, logged once with one prefix."""

from __future__ import annotations

from ops.staging import kernel_limits
from ops.staging.system import log


def _proc(tmp_path, instances: int, watches: int):
    (tmp_path / "fs" / "inotify").mkdir(parents=True)
    (tmp_path / "fs/inotify/max_user_instances").write_text(f"{instances}\n")
    (tmp_path / "fs/inotify/max_user_watches").write_text(f"{watches}\n")
    return tmp_path


def test_low_limit_raised_and_logged_with_one_prefix(tmp_path, capsys):
    proc = _proc(tmp_path, 128, 10**7)
    kernel_limits.ensure(proc, log=log)
    assert (proc / "fs/inotify/max_user_instances").read_text() == "8192"
    assert (proc / "fs/inotify/max_user_watches").read_text().strip() == str(10**7)  # higher: left alone
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["[staging] raised fs.inotify.max_user_instances from 128 to 8192 for container hosts"]


def test_unreadable_limit_is_reported_not_raised(tmp_path, capsys):
    proc = _proc(tmp_path, 8192, 524288)
    (proc / "fs/inotify/max_user_watches").write_text("not a number")
    kernel_limits.ensure(proc, log=log)
    err = capsys.readouterr().err
    assert err.startswith("[staging] could not raise fs.inotify.max_user_watches:") and "[staging] [staging]" not in err
