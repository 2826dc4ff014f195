"""Staging VMs only: cache the code that Python compiles from sources inside zip files.

Loaded at interpreter start by vlfleet_zipcode.pth in the VM's system site-packages (ops/staging/vms.py puts both
there). Every Ansible module arrives as a zip of Python sources (AnsiballZ), and so does the host program (a
zipapp), and zipimport never caches bytecode: each task compiles ansible.module_utils anew. On a native CPU that
is a tenth of a second; on a VM emulated under TCG it is about 2 s of every task's 5. This keeps each compiled
module in a per-user directory, keyed by its source's sha256, so a changed source is compiled again. The release
venv (no system site-packages) never loads it, so the service runs as on any host.
"""

import hashlib
import marshal
import os
import sys
import types
import zipimport

CACHE_DIR = os.path.join(os.environ.get("TMPDIR") or "/var/tmp", f"vlfleet-zipcode-{os.getuid()}")
_compile = getattr(zipimport, "_compile_source", None)


def _refile(code: types.CodeType, filename: str) -> types.CodeType:
    """``code`` with ``filename`` in it and every function it defines (the cached copy names the zip it came from,
    which for a pipelined Ansible task is another run's temporary file)."""
    consts = tuple(_refile(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _compile_cached(pathname: str, source: bytes) -> types.CodeType:
    path = os.path.join(CACHE_DIR, f"{hashlib.sha256(source).hexdigest()}.{sys.implementation.cache_tag}")
    try:
        with open(path, "rb") as f:
            return _refile(marshal.load(f), pathname)
    except (OSError, EOFError, ValueError, TypeError):
        pass  # not cached yet, or unreadable: compile as zipimport does
    code = _compile(pathname, source)
    try:
        os.makedirs(CACHE_DIR, mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "wb") as f:
            marshal.dump(code, f)
        os.replace(tmp, path)  # concurrent tasks: each writes its own file, the last rename wins
    except OSError:
        pass  # a full or read-only /var/tmp only costs the compile
    return code


if _compile is not None:  # a Python whose zipimport compiles elsewhere runs unchanged
    zipimport._compile_source = _compile_cached
