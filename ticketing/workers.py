"""Who a worker is, as claims and audit rows name it."""

import os
import socket


def worker_identity() -> str:
    # Computed per call: a prefork child has its own pid.
    return f"{socket.gethostname()}:{os.getpid()}"
