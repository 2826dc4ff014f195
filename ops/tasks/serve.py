"""`vlfleet serve`: run the inference service in the foreground, as a host runs it."""

from __future__ import annotations

import os

from invoke import Exit, task


@task(help={
    "model": "OpenVINO model artifact directory (from model.convert / model.build)",
    "host": "address to bind (default: VLFLEET_HOST, else 127.0.0.1)",
    "port": "port (default: VLFLEET_PORT, else 8000)",
})
def serve(c, model, host=None, port=None):
    """Serve the model under gunicorn (1 worker, threads) until Ctrl-C; other settings from VLFLEET_* variables."""
    given = {"VLFLEET_MODEL_DIR": model, "VLFLEET_HOST": host, "VLFLEET_PORT": port}
    os.environ.update({name: str(value) for name, value in given.items() if value is not None})
    from service.__main__ import main

    try:
        main([])
    except SystemExit as e:
        if e.code:
            raise Exit(code=e.code) from None
