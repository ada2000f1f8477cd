"""Messages between grader processes: a 4-byte length, then JSON. Plain data only (no pickles),
size-limited, read with a deadline. Used between the grader and the sandboxed child that runs
a submission, and between the grader and its GPU harness."""
from __future__ import annotations

import json
import math
import select
import socket
import struct
import time

MAX_MESSAGE = 64 << 20


class ChannelClosed(Exception):
    """The other side went away (it exited, crashed or was killed)."""


class ChannelTimeout(Exception):
    """No complete message before the deadline."""


class BadMessage(Exception):
    """The other side sent something that is not a message of this protocol."""


def send(sock: socket.socket, obj) -> None:
    data = json.dumps(obj, allow_nan=True).encode()
    if len(data) > MAX_MESSAGE:
        raise BadMessage(f"message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    sock.sendall(struct.pack("<I", len(data)) + data)


def _read_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChannelTimeout()
            ready, _, _ = select.select([sock], [], [], left)
            if not ready:
                raise ChannelTimeout()
        try:
            chunk = sock.recv(min(n - got, 1 << 20))
        except (ConnectionResetError, OSError) as e:
            raise ChannelClosed(str(e)) from None
        if not chunk:
            raise ChannelClosed("end of stream")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket, timeout: float | None = None, max_bytes: int = MAX_MESSAGE):
    deadline = None if timeout is None or math.isinf(timeout) else time.monotonic() + timeout
    (n,) = struct.unpack("<I", _read_exact(sock, 4, deadline))
    if n > max_bytes:
        raise BadMessage(f"message of {n} bytes exceeds the limit of {max_bytes}")
    data = _read_exact(sock, n, deadline)
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadMessage(f"not a JSON message: {e}") from None
