"""The lb role's nginx site rendered from templates/ as the role renders it, and a real nginx running it on loopback.

The role's defaults are the template's variables here, so a test names only what it changes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import jinja2
import yaml

REPO = Path(__file__).resolve().parents[1]
NJS_MODULE = Path("/usr/lib/nginx/modules/ngx_http_js_module.so")  # roles/lb/vars/Debian.yml


def lb_defaults() -> dict:
    return yaml.safe_load((REPO / "roles/lb/defaults/main.yml").read_text())


def render(name: str, **variables) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(REPO / "templates"), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=True)
    return env.get_template(name).render(**variables)


def site(upstreams: list[dict], **overrides) -> str:
    """The site for ``upstreams`` ({name, address, port, down}) with the role's defaults under ``overrides``."""
    variables = {**lb_defaults(), "lb_listen_ipv6": False, "lb_affinity_script": "/etc/nginx/njs/vlfleet-affinity.js",
                 **overrides}
    return render("nginx-vlfleet.conf.j2", lb_upstreams=upstreams, **variables)


class Nginx:
    """nginx serving a rendered site from ``directory`` (its own prefix, pid file and logs), stopped by its PID."""

    def __init__(self, directory: Path, upstreams: list[dict], **overrides):
        self.dir = directory
        (directory / "logs").mkdir(parents=True, exist_ok=True)
        script = directory / "affinity.js"
        script.write_text(render("nginx-vlfleet-affinity.js.j2"))
        self.overrides = {"lb_affinity_script": str(script), **overrides}
        self.write(upstreams)
        load = f"load_module {NJS_MODULE};" if self.overrides.get("lb_affinity", True) else ""
        (directory / "nginx.conf").write_text(
            f"{load} pid nginx.pid; error_log logs/error.log info; events {{}} "
            "http { access_log logs/access.log; include site.conf; }\n")

    def write(self, upstreams: list[dict]) -> str:
        text = site(upstreams, **self.overrides)
        (self.dir / "site.conf").write_text(text)
        return text

    def _nginx(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["nginx", "-p", str(self.dir), "-c", str(self.dir / "nginx.conf"), *args],
                              capture_output=True, text=True, timeout=60)

    def test(self) -> subprocess.CompletedProcess:
        return self._nginx("-t", "-q")

    def start(self) -> Nginx:
        done = self._nginx()
        assert done.returncode == 0, done.stderr
        return self

    def reload(self, timeout: float = 10) -> None:
        """Like `systemctl reload nginx`; returns once the old workers are gone, so every new connection gets the
        edited site."""
        import psutil

        master = psutil.Process(self.pid())
        old = master.children()
        master.send_signal(signal.SIGHUP)
        _gone, alive = psutil.wait_procs(old, timeout=timeout)
        assert not alive, f"nginx's old workers still run {timeout} s after the reload"

    def pid(self) -> int:
        return int((self.dir / "nginx.pid").read_text())

    def stop(self) -> None:
        try:
            pid = self.pid()
        except (OSError, ValueError):
            return
        os.kill(pid, signal.SIGQUIT)
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
