"""The staging VMs' cache of code compiled from zipped sources (ops/staging/guest/vlfleet_zipcode.py), run in a
child Python as the VM's system Python loads it: through a .pth in a site directory."""

from __future__ import annotations

import marshal
import subprocess
import sys
import zipfile
from pathlib import Path

from ops.staging.vms import GUEST_DIR, ZIPCODE_FILES, install_zipcode_cache

SHOW = """
import sys, traceback
sys.path.insert(0, sys.argv[1])
import m
print(m.VALUE)
try:
    m.fail()
except ValueError:
    print(traceback.extract_tb(sys.exc_info()[2])[-1].filename)
"""


def _zip(path: Path, value: str) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("m.py", f"VALUE = {value!r}\ndef fail():\n    raise ValueError\n")
    return path


def _cache(tmp: Path) -> Path:
    [cache] = tmp.glob("vlfleet-zipcode-*")
    return cache


def _run(root: Path, archive: Path, tmp: Path) -> list[str]:
    site = root / "usr/lib/python3/dist-packages"
    code = f"import site; site.addsitedir({str(site)!r}); exec(compile({SHOW!r}, 'show', 'exec'))"
    out = subprocess.run([sys.executable, "-c", code, str(archive)], capture_output=True, text=True, timeout=60,
                         env={"TMPDIR": str(tmp), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_the_second_import_uses_the_cached_code_and_names_the_current_zip(tmp_path):
    install_zipcode_cache(tmp_path / "root")
    assert _run(tmp_path / "root", _zip(tmp_path / "a.zip", "one"), tmp_path) == ["one", str(tmp_path / "a.zip/m.py")]
    [cached] = _cache(tmp_path).iterdir()
    # Swap the cached code for other code: a second import that prints it read the cache, not the source.
    cached.write_bytes(marshal.dumps(compile("VALUE = 'cached'\ndef fail():\n    raise ValueError\n", "x", "exec")))
    assert _run(tmp_path / "root", _zip(tmp_path / "b.zip", "one"), tmp_path) == ["cached",
                                                                                 str(tmp_path / "b.zip/m.py")]


def test_a_changed_source_is_compiled_again(tmp_path):
    install_zipcode_cache(tmp_path / "root")
    _run(tmp_path / "root", _zip(tmp_path / "a.zip", "one"), tmp_path)
    assert _run(tmp_path / "root", _zip(tmp_path / "a.zip", "two"), tmp_path)[0] == "two"
    assert len(list(_cache(tmp_path).iterdir())) == 2


def test_an_unwritable_cache_only_costs_the_compile(tmp_path):
    install_zipcode_cache(tmp_path / "root")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert _run(tmp_path / "root", _zip(tmp_path / "a.zip", "one"), blocker)[0] == "one"


def test_the_module_and_its_pth_are_installed(tmp_path):
    install_zipcode_cache(tmp_path)
    site = tmp_path / "usr/lib/python3/dist-packages"
    for name in ZIPCODE_FILES:
        assert (site / name).read_bytes() == (GUEST_DIR / name).read_bytes()
