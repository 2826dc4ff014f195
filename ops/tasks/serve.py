"""`vlfleet serve`: run the inference service in the foreground, as a host runs it."""

from __future__ import annotations

import os

from invoke import Exit, task


@task(help={
    "model": "OpenVINO model artifact directory (from model.convert / model.build)",
    "host": "address to bind (default 127.0.0.1)",
    "port": "port (default 8000)",
})
def serve(c, model, host="127.0.0.1", port=8000):
    """Serve the model under gunicorn (1 worker, threads) until Ctrl-C; other settings from VLFLEET_* variables."""
    os.environ.update({"VLFLEET_MODEL_DIR": str(model), "VLFLEET_HOST": str(host), "VLFLEET_PORT": str(port)})
    from service.__main__ import main

    try:
        main([])
    except SystemExit as e:
        if e.code:
            raise Exit(code=e.code) from None
