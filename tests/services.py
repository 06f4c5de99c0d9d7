"""What the real services of the suite (clamd, Dovecot) need before they start: their binary and a port.

    from tests.services import ensure_installed, free_port

`ensure_installed("clamd", "clamav-daemon")` returns the binary's path; when it
is missing it installs the Debian package with apt-get (root, as in CI),
running `apt-get update` first only if the plain install fails.
"""

import os
import shutil
import socket
import subprocess

import pytest


def find_binary(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None
    )


def ensure_installed(name: str, package: str) -> str:
    """The path of binary `name`, installing Debian `package` first if it is not there."""
    binary = find_binary(name)
    if binary:
        return binary
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", package]
    if subprocess.run(install, env=env, stdin=subprocess.DEVNULL, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], env=env, stdin=subprocess.DEVNULL, capture_output=True)
        done = subprocess.run(install, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if done.returncode != 0:
            pytest.fail(f"could not install {package}: {done.stderr[-2000:]}")
    binary = find_binary(name)
    if not binary:
        pytest.fail(f"{package} installed but no {name} binary found")
    return binary


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (callers retry on another if it is taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
