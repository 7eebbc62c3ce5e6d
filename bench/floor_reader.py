"""The floor of startup with records: a Python process that opens the state database, reads
every workspace and obligation row, and announces READY=1. Run as
`python -m bench.floor_reader DB`."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import sys


def main(path: str) -> None:
    db = sqlite3.connect(path)
    rows = db.execute("SELECT * FROM workspaces").fetchall()
    rows += db.execute("SELECT * FROM cleanup_obligations").fetchall()
    db.close()
    address = os.environ.get("NOTIFY_SOCKET")
    if address:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(f"READY=1\nSTATUS={len(rows)} rows".encode(), address)
    signal.pause()  # stay up like a server until SIGTERM


if __name__ == "__main__":
    main(sys.argv[1])
