"""Signals that stop a run (Ctrl-C, SIGTERM, SIGHUP), even while Python would drop them (inside
a ``__del__``, as when the garbage collector frees an NDArray, or inside MXNet's optimizer
callback, which the book's Trainer makes on two devices): ``DeferredInterrupt`` raises them
at once or right after the step, and lets SIGQUIT print every thread's stack. docs/events.md
says why; docs/outputs.md gives the exit codes.
"""
import contextlib
import faulthandler
import signal
import sys
import threading

from mxnet.kvstore.kvstore import _updater_wrapper

from ..runtime.startup import Interrupted
from .checkpoint import save_checkpoint
from .events import PRIORITY, BatchEnd, EpochEnd

__all__ = ['Interrupted', 'DeferredInterrupt', 'STOPPING']

# The Python function MXNet calls from C as a kvstore's updater. The package's own Trainers never
# make that callback (init_training updates in Python, train refuses one that would update on the
# kvstore), but the book's Trainer, which python -m gluon_mgpu.compare runs as printed, does on
# two devices.
_CALLBACK = _updater_wrapper(None).__code__
# Where a signal waits as inside a __del__: a checkpoint being written, a second's work that
# keeps an epoch trained and tested for minutes (the stop comes right after it, complete).
_DEFERRING = (_CALLBACK, save_checkpoint.__code__)
# The handler each signal has when nobody took it over; only then is it taken.
_DEFAULTS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL,
             signal.SIGHUP: signal.SIG_DFL}
STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class DeferredInterrupt(BatchEnd, EpochEnd):
    """Context manager for the signals that stop a run; ``check()`` raises a deferred one.

    Inside it, ``signals`` (default SIGINT, SIGTERM, SIGHUP) raise ``Interrupted`` at once or,
    inside a ``__del__`` or MXNet's optimizer callback (where Python would drop the exception)
    or ``save_checkpoint`` (the epoch would be lost), at the next ``check()`` or when the block
    ends (``requested`` and ``signum`` say one waits); SIGQUIT prints every thread's stack, then
    quits. Only default handlers of the main thread are taken over (not under ``nohup``), and
    given back on exit. As an event handler it calls ``check()`` after every step and epoch,
    last of all (docs/events.md)::

        with DeferredInterrupt() as interrupt:
            train(..., event_handlers=[EpochLine(), interrupt])
    """

    priority = PRIORITY['DeferredInterrupt']

    def __init__(self, signals=STOPPING):
        for signum in signals:
            if signum not in _DEFAULTS:
                raise ValueError('DeferredInterrupt handles SIGINT, SIGTERM and SIGHUP, got %r; '
                                 'pass signals=(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) or '
                                 'a part of it' % (signum,))
        self.signals = tuple(signals)
        self.requested, self.signum = False, None
        self._previous, self._quit_dump = {}, False

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                if signal.getsignal(signum) is _DEFAULTS[signum]:
                    self._previous[signum] = signal.signal(signum, self._handle)
            if signal.getsignal(signal.SIGQUIT) is signal.SIG_DFL:
                # Every thread's stack on stderr (sys.__stderr__ when sys.stderr has no file
                # descriptor), then SIGQUIT's default action; in C, so also inside MXNet.
                for stream in (sys.stderr, sys.__stderr__):
                    with contextlib.suppress(AttributeError, ValueError, OSError, RuntimeError):
                        faulthandler.register(signal.SIGQUIT, file=stream, all_threads=True,
                                              chain=True)
                        self._quit_dump = True
                        break
        return self

    def __exit__(self, kind, *_):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
        if self._quit_dump:
            faulthandler.unregister(signal.SIGQUIT)
            self._quit_dump = False
        if kind is None:
            self.check()  # a signal still waiting is raised, never dropped with the block

    def _handle(self, signum, frame):
        # Inside a __del__ (an NDArray freed by the garbage collector, at any point) or MXNet's
        # optimizer callback, Python would drop what is raised; inside a checkpoint's write, it
        # would discard the epoch: the signal waits for check().
        while frame is not None:
            if frame.f_code in _DEFERRING or frame.f_code.co_name == '__del__':
                if not self.requested:  # the first signal is the one reported
                    self.requested, self.signum = True, signum
                return
            frame = frame.f_back
        raise Interrupted(signum)

    def check(self, *args, **kwargs):
        """Raise ``Interrupted`` if a signal is waiting; takes any hook arguments."""
        if self.requested:
            self.requested = False
            signum, self.signum = self.signum, None
            raise Interrupted(signum)

    batch_end = epoch_end = check
