"""The collector pause around whole-job work: nested and threaded pauses, and a
collector that was already off."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from scheduler_svc.services import gcpause


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    gc.enable()
    yield
    gc.enable()


def test_the_collector_is_off_inside_and_on_again_after() -> None:
    with gcpause.paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_it_is_on_again_after_an_error_inside() -> None:
    with pytest.raises(RuntimeError), gcpause.paused():
        raise RuntimeError("whole-job work failed")
    assert gc.isenabled()


def test_nested_pauses_resume_only_when_the_outermost_ends() -> None:
    with gcpause.paused():
        with gcpause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    with gcpause.paused():
        pass
    assert not gc.isenabled()


def test_pauses_in_two_threads_resume_when_the_last_ends() -> None:
    inside = threading.Event()
    release = threading.Event()

    def other() -> None:
        with gcpause.paused():
            inside.set()
            release.wait()

    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(10)
    with gcpause.paused():
        pass
    assert not gc.isenabled()  # the other thread's pause still holds
    release.set()
    t.join(10)
    assert not t.is_alive()
    assert gc.isenabled()
