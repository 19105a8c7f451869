"""A step's `tf.function` (`Compiled`), and which steps on a mesh hold their DTensor lowering
(`MeshSteps`): the steps of one `make_steps` at a time.

Why one at a time (TensorFlow 2.21, read in its source and seen in a debugger): DTensor lowers
every traced step through one MLIR pass pipeline per process. Its last pass outlines each loop
into functions named after a name cache keyed by the loop op's address, which it never clears
(`OpOrArgNameMapper`, a member of `RegionControlFlowToFunctional`); the functions go into the
context's function library and stay there until the traced function that owns the lowering is
deleted. A later lowering whose loop op is allocated where an earlier one's was gets that
earlier name (`while/while7_body`), and while the earlier lowering is alive, adding its own
body under it fails: "Cannot add function 'while/while7_body' because a different function
with the same name already exists". Seen where one process keeps several runs' steps (the test
suite, a notebook): 25 of 30 live lowerings with nested loops clashed, the retry that traced
again 16 of 30. With the steps of other `make_steps` deleted first, no loop function of another
lowering is in the library when a step lowers, so a stale name finds none to clash with.
(`tf.cond` branches are named after their traced functions, never by address. A train call is
traced once: a run's blocks keep their shapes. Its eval step, lowered beside it, has no loop
unless a `model.build` model's forward pass has its own.)
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

from dtcli import tfruntime


class MeshSteps:
    """The compiled steps of one `make_steps` on a mesh. While they hold their lowerings no
    other `make_steps`' steps on a mesh do: the first call of one of them deletes the traced
    functions of the steps that held theirs (which trace and lower again if called again)."""

    # The steps whose lowerings may be alive (a weak reference: dropped steps hold nothing).
    _holding: weakref.ref | None = None

    def __init__(self) -> None:
        self._functions: weakref.WeakSet[Compiled] = weakref.WeakSet()

    def add(self, function: Compiled) -> None:
        self._functions.add(function)

    def hold(self) -> None:
        """Delete the lowerings of the steps that hold theirs, unless these are they."""
        holding = MeshSteps._holding() if MeshSteps._holding is not None else None
        if holding is self:
            return
        if holding is not None:
            holding._release()
        MeshSteps._holding = weakref.ref(self)

    def _release(self) -> None:
        dropped = [ref for ref in (f.release() for f in list(self._functions)) if ref]
        # A traced function is deleted with its last reference; one that an exception's
        # traceback still holds (a reference cycle) needs the collector.
        if any(ref() is not None for ref in dropped):
            gc.collect()


class Compiled:
    """A step's `tf.function`, made by `make()` at its first call (and again after its steps
    released their lowering, see MeshSteps). An entry of XLA's compile cache that TensorFlow
    cannot read fails the compile before anything runs: it is deleted and the step traced and
    compiled anew, once."""

    def __init__(self, make: Any, steps: MeshSteps | None = None) -> None:
        self._make = make
        self._steps = steps
        self._function: Any = None
        if steps is not None:
            steps.add(self)

    def __call__(self, *args: Any) -> Any:
        import tensorflow as tf

        if self._steps is not None:
            self._steps.hold()
        if self._function is None:
            self._function = self._make()
        try:
            return self._function(*args)
        except (tf.errors.DataLossError, tf.errors.OutOfRangeError) as exc:
            if not tfruntime.drop_unreadable_xla_cache(str(exc)):
                raise
        self._function = self._make()
        return self._function(*args)

    def release(self) -> weakref.ref | None:
        """Forget the traced function; a weak reference to it (None: there was none)."""
        function, self._function = self._function, None
        return None if function is None else weakref.ref(function)
