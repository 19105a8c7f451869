"""Ctrl-C while generate's steps run in TensorFlow: held until the step is out (no TensorFlow
imported here)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


class CtrlC:
    """SIGINT's handler while TensorFlow runs generate's steps: the first Ctrl-C is held until
    the step is out (raised inside TensorFlow's C++ callbacks, a KeyboardInterrupt came back as
    a SystemError, "returned a result with an exception set", exit 1); a second interrupts at
    once."""

    def __init__(self) -> None:
        self.pressed = False

    def __call__(self, signum: int, frame: Any) -> None:
        if self.pressed:
            raise KeyboardInterrupt
        self.pressed = True

    def raise_if_pressed(self) -> None:
        if self.pressed:
            raise KeyboardInterrupt


@contextlib.contextmanager
def held() -> Iterator[CtrlC]:
    """A CtrlC as SIGINT's handler for the block, where Python's own handler is SIGINT's (the
    main thread of a process that did not ignore it); the handler found is put back after."""
    held = CtrlC()
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    found = signal.getsignal(signal.SIGINT)
    if found is not signal.default_int_handler:
        yield held
        return
    signal.signal(signal.SIGINT, held)
    try:
        yield held
    finally:
        signal.signal(signal.SIGINT, found)
