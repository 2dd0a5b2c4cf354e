"""Whether the bytes a connection sent hold a whole HTTP/1.1 request yet.

``RunguardWorker``'s event loop reads a request whole before a thread gets it (see
``worker.py``): this tells it when to stop reading, without parsing more than the
head's ``Content-Length``, ``Transfer-Encoding`` and ``Expect`` and the chunk sizes.
What is malformed counts as whole: gunicorn's parser then answers it (400, 414, 431).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["BUFFERED_BODY", "HEAD_LIMIT", "Pending", "chunked_complete", "request_ready"]

HEAD_LIMIT = 1024 * 1024  # a head without its end this long goes to the parser (414 / 431)
BUFFERED_BODY = 4 * 1024 * 1024 + 65536  # larger bodies are read by the thread, bounded per read


@dataclass(eq=False)
class Pending:
    """A connection whose request the loop is still reading."""

    conn: Any
    deadline: float
    data: bytearray = field(default_factory=bytearray)
    handshaking: bool = False
    need: int | None = None  # bytes of head and body, once the head is read
    chunked: int | None = None  # where a chunked body starts


def request_ready(pending: Pending, sock: Any) -> bool:
    """Whether ``pending.data`` holds a whole request (or what the parser must refuse)."""
    data = pending.data
    if pending.need is None and pending.chunked is None:
        end = data.find(b"\r\n\r\n")
        if end < 0:
            return len(data) > HEAD_LIMIT
        length, chunked, expect = 0, False, -1
        start = data.find(b"\r\n") + 2
        while start < end:
            stop = data.find(b"\r\n", start)
            name, _, value = bytes(data[start:stop]).partition(b":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"content-length":
                if not value.isdigit():
                    return True  # the parser answers 400
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = value.endswith(b"chunked")
            elif name == b"expect" and value == b"100-continue":
                expect = start
            start = stop + 2
        if expect >= 0 and len(data) < end + 4 + length:
            # the client waits for this before it sends the body: say it from here
            del data[expect : data.find(b"\r\n", expect) + 2]
            end = data.find(b"\r\n\r\n")
            try:
                sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
            except OSError:
                pass  # the client sends the body after a second of its own anyway
        if chunked:
            pending.chunked = end + 4
        else:
            pending.need = end + 4 + length
    if pending.chunked is not None:
        return chunked_complete(data, pending.chunked) or len(data) > BUFFERED_BODY
    assert pending.need is not None
    return len(data) >= pending.need or pending.need > BUFFERED_BODY


def chunked_complete(data: bytearray, pos: int) -> bool:
    while pos <= len(data):
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            return False
        try:
            size = int(bytes(data[pos:eol]).split(b";")[0].strip(), 16)
        except ValueError:
            return True  # the parser answers 400
        if size == 0:
            return data.find(b"\r\n\r\n", eol) >= 0  # after the trailers, if any
        pos = eol + 2 + size + 2
    return False
