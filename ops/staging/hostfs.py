"""Per-host files written on top of the shared base image: identity, SSH keys, hostname."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from ops.staging.image import DEPLOY_UID, DEPLOY_USER
from ops.staging.system import run


def personalise(root: Path, hostname: str, pubkey: str) -> None:
    (root / "etc/hostname").write_text(hostname + "\n")
    (root / "etc/hosts").write_text(f"127.0.0.1\tlocalhost\n127.0.1.1\t{hostname}\n"
                                    "::1\tlocalhost ip6-localhost ip6-loopback\n")
    # A fixed machine-id per host: no first-boot logic, distinct journal and DHCP identities.
    (root / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
    ssh_dir = root / "home" / DEPLOY_USER / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    keys = ssh_dir / "authorized_keys"
    keys.write_text(pubkey.strip() + "\n")
    keys.chmod(0o600)
    for p in (ssh_dir, keys):
        os.chown(p, DEPLOY_UID, DEPLOY_UID)
    # Host keys of its own, as a real server has (the base image ships none).
    run(["ssh-keygen", "-A", "-f", str(root)])
