"""A private apt root on the controller: its own sources, lists, status and archives under the cache, so that
resolving and downloading for the hosts never reads or writes the controller's own apt state.

apt still reads the controller's apt.conf.d (proxies, timeouts), but the config written here comes last, moves
every directory, and clears the hooks other packages put there (docker-clean's Post-Invoke would empty the
controller's archive cache)."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ops.os_mirror import MirrorError

APT_TIMEOUT = 900.0  # one apt-get run; a mirror that stalls longer is reported, not waited for
_HOOKS = ("APT::Update::Pre-Invoke", "APT::Update::Post-Invoke", "APT::Update::Post-Invoke-Success",
          "DPkg::Pre-Invoke", "DPkg::Post-Invoke", "DPkg::Pre-Install-Pkgs", "APT::Periodic")


@dataclass(frozen=True)
class Source:
    mirror: str
    suites: tuple[str, ...]
    components: tuple[str, ...]
    keyring: str
    trusted: bool = False  # an unsigned local repository (tests); upstream suites are always verified

    def lines(self) -> str:
        option = "trusted=yes" if self.trusted else f"signed-by={self.keyring}"
        return "".join(f"deb [{option}] {self.mirror} {' '.join((s, *self.components))}\n" for s in self.suites)


@dataclass(frozen=True)
class Download:
    """One .deb apt chose, as `--print-uris` names it (file name as stored in the archives directory)."""

    uri: str
    filename: str
    size: int


class AptRoot:
    def __init__(self, root: Path, source: Source, arch: str = "amd64"):
        self.root, self.source, self.arch = root, source, arch
        self.archives = root / "archives"
        self.config = root / "apt.conf"

    def prepare(self, status: Path | None) -> None:
        """Write the config for this run; ``status`` is the dpkg status resolved against (None: an empty one)."""
        for d in ("lists/partial", "archives/partial", "empty", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        empty_status = self.root / "empty-status"
        empty_status.write_text("")
        (self.root / "sources.list").write_text(self.source.lines())
        self.config.write_text(self._config(status or empty_status))

    def _config(self, status: Path) -> str:
        r = self.root
        settings = {
            "Dir::Etc::SourceList": r / "sources.list", "Dir::Etc::SourceParts": r / "empty",
            "Dir::Etc::Preferences": r / "empty/none", "Dir::Etc::PreferencesParts": r / "empty",
            "Dir::State": r, "Dir::State::Lists": r / "lists", "Dir::State::status": status,
            "Dir::State::extended_states": r / "extended_states",
            "Dir::Cache": r, "Dir::Cache::archives": self.archives,
            "Dir::Cache::pkgcache": "", "Dir::Cache::srcpkgcache": "", "Dir::Log": r / "log",
            "APT::Architecture": self.arch, "APT::Install-Recommends": "false",
            "APT::Install-Suggests": "false", "Acquire::Languages": "none",
            # The cache lives under root's home, which apt's unprivileged download user cannot enter.
            "APT::Sandbox::User": "root",
        }
        lines = [f'{k} "{v}";' for k, v in settings.items()]
        lines.append(f'APT::Architectures {{ "{self.arch}"; }};')
        lines += [f"#clear {hook};" for hook in _HOOKS]
        return "\n".join(lines) + "\n"

    def apt_get(self, *args: str, echo: Callable[[str], None] | None = None, options: tuple[str, ...] = ()) -> str:
        cmd = ["apt-get", "-c", str(self.config), *(f"-o{o}" for o in options), "-q", "-y", *args]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=APT_TIMEOUT,
                                  stdin=subprocess.DEVNULL, env={**os.environ, "LC_ALL": "C"})
        except FileNotFoundError as e:
            raise MirrorError("apt-get not found: building the mirror needs a Debian or Ubuntu controller") from e
        except subprocess.TimeoutExpired as e:
            raise MirrorError(f"`{' '.join(args)}` against {self.source.mirror} did not finish within "
                              f"{APT_TIMEOUT:.0f} s: check that the controller reaches the mirror") from e
        if echo:
            for line in done.stdout.splitlines():
                if line.startswith(("Get:", "Hit:", "Err:", "Fetched")):
                    echo(line)
        if done.returncode != 0:
            raise MirrorError(f"apt-get {args[0]} failed (exit {done.returncode}):\n{_explain(done.stderr)}")
        return done.stdout

    def update(self, echo: Callable[[str], None] | None = None) -> None:
        """Fetch the suites' indexes, verified against the source's keyring (a bad signature fails here)."""
        self.apt_get("update", echo=echo)

    def resolve(self, packages: list[str]) -> list[Download]:
        """The .debs apt would install for ``packages`` on a system with the prepared status."""
        # --print-uris leaves out what the archives directory already holds: resolve against an empty one.
        empty = self.root / "resolve-archives"
        (empty / "partial").mkdir(parents=True, exist_ok=True)
        out = self.apt_get("install", "--print-uris", *packages, options=(f"Dir::Cache::archives={empty}",))
        return parse_print_uris(out)

    def download(self, packages: list[str], echo: Callable[[str], None] | None = None) -> None:
        self.apt_get("install", "--download-only", *packages, echo=echo)


def parse_print_uris(out: str) -> list[Download]:
    # 'http://.../pool/main/n/numactl/numactl_2.0.16-1_amd64.deb' numactl_2.0.16-1_amd64.deb 36852 MD5Sum:...
    found = re.findall(r"^'([^']+\.deb)' (\S+) (\d+) ", out, re.MULTILINE)
    return [Download(uri, name, int(size)) for uri, name, size in found]


def _explain(stderr: str) -> str:
    text = stderr.strip()[-2000:]
    if "NO_PUBKEY" in text or "not signed" in text or "signatures couldn't be verified" in text:
        text += ("\nThe suite's signature did not verify with the keyring given: install the distribution's "
                 "archive keyring (debian-archive-keyring or ubuntu-keyring) or pass --keyring FILE.")
    elif "Unable to locate package" in text or "has no installation candidate" in text:
        text += "\nThe mirror's suite does not carry that package: check --suite, --mirror and the components."
    return text
