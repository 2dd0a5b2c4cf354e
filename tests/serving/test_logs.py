"""Logs never block or fail the code that logs (webhook/serving/linewriter.py, logs.py)."""

from __future__ import annotations

import fcntl
import logging
import os
import select
from collections.abc import Iterator

import pytest

from webhook.serving.auditlog import AuditLog
from webhook.serving.linewriter import LineWriter
from webhook.serving.logs import LineHandler

Pipe = tuple[int, int]


@pytest.fixture
def pipe() -> Iterator[Pipe]:
    """A pipe of one page (4 KiB): a few lines fill it."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    yield read_end, write_end
    for fd in (read_end, write_end):
        try:
            os.close(fd)
        except OSError:
            pass


def read_bytes(fd: int, size: int, timeout: float = 10.0) -> bytes:
    """Read until ``size`` bytes came, each wait bounded."""
    data = b""
    for _ in range(10_000):
        if len(data) >= size or not select.select([fd], [], [], timeout)[0]:
            break
        data += os.read(fd, 65536)
    return data


def test_lines_come_out_whole_and_in_order(pipe: Pipe) -> None:
    read_end, write_end = pipe
    writer = LineWriter("test", write_end, capacity=1000)
    lines = [b"%d %s\n" % (i, b"x" * (i % 300)) for i in range(500)]  # 75 KiB, 4 KiB pipe
    assert all(writer.put(line) for line in lines)
    assert read_bytes(read_end, sum(map(len, lines))) == b"".join(lines)
    assert writer.flush(10.0)
    assert (writer.written, writer.dropped) == (500, 0)
    assert writer.health() == {"status": "ok", "dropped": 0, "queued": 0}


def test_a_sink_nobody_reads_fills_the_queue_then_lines_are_dropped_and_counted(
    pipe: Pipe,
) -> None:
    read_end, write_end = pipe
    counted: list[int] = []
    writer = LineWriter("test", write_end, capacity=8, on_drop=counted.append)
    line = b"y" * 999 + b"\n"
    accepted = [writer.put(line) for _ in range(100)]  # returns: the test does not hang
    assert accepted.count(False) == writer.dropped == sum(counted) > 0
    health = writer.health()
    assert health["status"] == "degraded" and "dropped" in str(health["reason"])
    # Once read, what was accepted comes out, whole.
    data = read_bytes(read_end, accepted.count(True) * len(line))
    assert data == line * accepted.count(True)
    assert writer.flush(10.0) and writer.written == accepted.count(True)


def test_a_reader_gone_or_no_descriptor_drops_and_says_why(pipe: Pipe) -> None:
    read_end, write_end = pipe
    os.close(read_end)
    writer = LineWriter("test", write_end, capacity=8)
    assert writer.put(b"a\n")  # queued; its write fails
    assert writer.flush(10.0)
    assert writer.dropped == 1 and not writer.put(b"b\n") and writer.dropped == 2
    health = writer.health()
    assert health["status"] == "degraded" and "Broken pipe" in str(health["reason"])

    closed = LineWriter.for_stream("audit", None, capacity=8)  # stdout closed at start
    assert not closed.put(b"c\n")
    assert closed.health()["reason"] == "audit: closed at start"


def test_the_log_handler_never_raises_nor_blocks(pipe: Pipe) -> None:
    read_end, write_end = pipe
    writer = LineWriter("test", write_end, capacity=8)
    logger = logging.getLogger("runguard.test-logs")
    handler = LineHandler(writer, logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("hello %s", "world")
        logger.warning("bad %d", "not a number")  # a format error: the line is lost, counted
        for _ in range(100):  # far more than pipe and queue take: dropped, not waited for
            logger.warning("x" * 500)
    finally:
        logger.removeHandler(handler)
    assert read_bytes(read_end, 21).startswith(b"WARNING hello world\n")
    assert writer.dropped > 1


def test_the_audit_log_reports_a_closed_stdout() -> None:
    audit = AuditLog(None)  # stdout: pytest's capture has a descriptor
    assert audit.health()["status"] == "ok"
    stream = open(os.devnull, "w")  # noqa: SIM115
    stream.close()
    closed = AuditLog(stream)
    closed.write({"uid": "a"})
    health = closed.health()
    assert health["status"] == "degraded" and health["dropped"] == 1
