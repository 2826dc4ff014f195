"""`python -m service` / `vlfleet-serve`: check the configuration and the artifact, then serve under gunicorn.

One gunicorn worker process (the model is loaded once) with a pool of threads (gthread); each open SSE
stream holds one thread while the single inference thread does the work.
"""

from __future__ import annotations

import ipaddress
import logging
import sys

from service.runtime import jsonlog
from service.runtime.settings import Settings, SettingsError, load

log = logging.getLogger("vlfleet.serve")

EXIT_CONFIG = 2
EXIT_ARTIFACT = 3


def check_hashes(directory) -> None:
    """The start gate's full part: every file's sha256 against the manifest (a same-size corruption passes
    ``check_startup``, which compares sizes). Raises ``ArtifactError`` naming the files."""
    from service.runtime.manifest import ArtifactError, verify

    report = verify(directory, full=True)
    fix = "copy the artifact again from the controller (the model_artifact role does it)"
    if report.modified:
        raise ArtifactError("file-hashes", directory, "file(s) differ from the manifest: "
                            + "; ".join(f"{n}: {why}" for n, why in report.modified.items()), fix)
    if report.id_mismatch:
        raise ArtifactError("file-hashes", directory, report.id_mismatch, fix)


def check_artifact(settings: Settings) -> None:
    from service.runtime.manifest import ArtifactError, check_startup, installed_runtime_version

    if settings.skip_artifact_check:
        log.warning("artifact checks skipped (VLFLEET_SKIP_ARTIFACT_CHECK=true); not for production")
        return
    try:
        check_startup(settings.model_dir, installed_runtime_version() or "0")
        if settings.verify_hashes:
            check_hashes(settings.model_dir)  # ~1 s per GB; a flipped byte must not be served
    except ArtifactError as e:
        raise SystemExit(_fatal(str(e), EXIT_ARTIFACT)) from None


def _fatal(message: str, code: int) -> int:
    log.error(message)
    print(f"vlfleet-serve: {message}", file=sys.stderr)
    return code


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _exit_worker(server, worker) -> None:
    """gunicorn's worker_exit hook: end the worker now, with its exit code, after the atexit handlers (log flush,
    the llamacpp engine's child) but without the interpreter's finalization.

    The inference thread is a daemon thread inside OpenVINO; finalizing the interpreter around it has hung (seen
    twice: an orphaned worker, one thread left in a futex wait, still holding the port). Nothing after the atexit
    handlers is worth that risk.
    """
    import atexit
    import os

    error = sys.exc_info()[1]  # gunicorn calls this from a finally block: the worker's SystemExit, if any
    code = error.code if isinstance(error, SystemExit) and isinstance(error.code, int) else int(error is not None)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve(settings: Settings) -> None:
    from gunicorn.app.base import BaseApplication

    from service.http.app import create_app

    if not _is_loopback(settings.host) and settings.api_keys_file is None:
        log.warning("binding %s without API keys: anyone who can reach this address can use the model; "
                    "put nginx in front or set VLFLEET_API_KEYS_FILE", settings.host)

    class Server(BaseApplication):
        def load_config(self):
            host = f"[{settings.host}]" if ":" in settings.host else settings.host
            for key, value in {
                "bind": f"{host}:{settings.port}",
                "workers": 1,  # one model in memory; concurrency comes from threads + the engine's queue
                "worker_class": "gthread",
                "threads": settings.http_threads,
                "timeout": 120,  # heartbeat of the worker, not a request limit
                "graceful_timeout": 30,  # SIGTERM lets open streams finish this long
                "keepalive": 5,
                "control_socket_disable": True,  # it would write under $HOME, which the unit makes read-only
                "accesslog": None,
                "errorlog": "-",
                "loglevel": settings.log_level,
                "worker_exit": _exit_worker,
            }.items():
                self.cfg.set(key, value)

        def load(self):
            return create_app(settings)

    Server().run()


def main(argv: list[str] | None = None) -> None:
    if argv is None:
        argv = sys.argv[1:]
    if argv:
        print("usage: python -m service   (configured by VLFLEET_* environment variables; see docs/configuration.md)",
              file=sys.stderr)
        raise SystemExit(EXIT_CONFIG)
    try:
        settings = load()
    except SettingsError as e:
        jsonlog.configure("info")
        raise SystemExit(_fatal(str(e), EXIT_CONFIG)) from None
    jsonlog.configure(settings.log_level)
    check_artifact(settings)
    serve(settings)


if __name__ == "__main__":
    main()
