"""A flat apt repository of the distribution packages the roles install (os_packages), for hosts that reach no
registry: `build` downloads them and their dependency closure on the controller in a private apt root, `index`
writes Packages/Release, `serve` hands the directory to hosts over HTTP."""

from __future__ import annotations


class MirrorError(RuntimeError):
    """A failure the operator can act on; the message says what was wrong and what to do."""
