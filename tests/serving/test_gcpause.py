"""The cyclic collector is paused only while a large review runs, and always resumed."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from webhook.serving import gcpause


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    gc.enable()
    yield
    gc.enable()


def test_a_small_review_leaves_the_collector_alone() -> None:
    for size in (None, 0, gcpause.LARGE - 1):
        with gcpause.paused(size):
            assert gc.isenabled()
    assert gc.isenabled()


def test_a_large_review_pauses_it_and_resumes_it_even_on_error() -> None:
    with pytest.raises(RuntimeError), gcpause.paused(gcpause.LARGE):
        assert not gc.isenabled()
        raise RuntimeError("a failing review")
    assert gc.isenabled()


def test_it_resumes_when_the_last_of_overlapping_reviews_ends() -> None:
    first_in, second_in, first_may_end = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []

    def first() -> None:
        with gcpause.paused(gcpause.LARGE):
            first_in.set()
            first_may_end.wait(10)
        seen.append(gc.isenabled())  # the second still runs

    thread = threading.Thread(target=first)
    thread.start()
    assert first_in.wait(10)
    with gcpause.paused(gcpause.LARGE):
        second_in.set()
        first_may_end.set()
        thread.join(10)
        assert not gc.isenabled()
    assert seen == [False]
    assert gc.isenabled()


def test_a_collector_turned_off_elsewhere_stays_off() -> None:
    gc.disable()
    with gcpause.paused(gcpause.LARGE):
        assert not gc.isenabled()
    assert not gc.isenabled()
