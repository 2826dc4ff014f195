"""Ansible filter `manylinux_glibc`: the oldest glibc on which every wheel of a wheelhouse installs, read from the
wheels' manylinux platform tags (PEP 600 `manylinux_2_28_x86_64`, and the older aliases manylinux1/2010/2014).

cpu_check compares it with the host's glibc before anything is installed, so a host too old for the runtime stops
with the reason instead of failing inside `pip install --no-index`.
"""

from __future__ import annotations

import re

# The aliases of PEP 513/571/599 and the glibc each stands for.
LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_PEP600 = re.compile(r"manylinux_(\d+)_(\d+)_\w+")
_ALIAS = re.compile(r"(manylinux1|manylinux2010|manylinux2014)_\w+")


def wheel_glibc(filename: str) -> tuple[int, int] | None:
    """The oldest glibc ``filename`` (a wheel's file name or path) installs on, as (major, minor); None when its
    platform tags name no manylinux (pure Python, or not for glibc Linux).

    A compressed tag set (``manylinux_2_17_x86_64.manylinux2014_x86_64``) installs wherever one of its tags does:
    the lowest counts.
    """
    name = filename.replace("\\", "/").rsplit("/", 1)[-1]
    if not name.endswith(".whl"):
        return None
    parts = name[: -len(".whl")].split("-")
    if len(parts) not in (5, 6):  # name-version[-build]-python-abi-platform
        return None
    found = []
    for tag in parts[-1].split("."):
        if m := _PEP600.fullmatch(tag):
            found.append((int(m.group(1)), int(m.group(2))))
        elif m := _ALIAS.fullmatch(tag):
            found.append(LEGACY[m.group(1)])
    return min(found) if found else None


def manylinux_glibc(filenames, default: str = "") -> dict:
    """``{"version": "2.28", "wheels": [...]}``: the oldest glibc every wheel of ``filenames`` installs on, and the
    wheels that need exactly that one. Without a manylinux wheel: ``default`` and no wheels."""
    needs = {name: v for name in filenames if (v := wheel_glibc(str(name))) is not None}
    if not needs:
        return {"version": str(default), "wheels": []}
    top = max(needs.values())
    wheels = sorted(str(name).replace("\\", "/").rsplit("/", 1)[-1] for name, v in needs.items() if v == top)
    return {"version": f"{top[0]}.{top[1]}", "wheels": wheels}


class FilterModule:
    """Ansible's entry point for the filters of this file."""

    def filters(self) -> dict:
        return {"manylinux_glibc": manylinux_glibc}
