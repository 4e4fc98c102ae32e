"""Ctrl-C during training: stop at once, and never let MXNet swallow it.

With the default kvstore, ``trainer.step`` runs the optimizer as a Python function that MXNet
calls back through ctypes, once per parameter, on the main thread. A ``KeyboardInterrupt``
raised inside such a callback is printed as "Exception ignored on calling ctypes callback
function" and dropped: the run goes on as if nothing happened. ``DeferredInterrupt`` raises
``KeyboardInterrupt`` at once, as Python does, except when Ctrl-C arrives inside that
callback: then it only notes it, and the training loop's hook (``check``) raises it right
after the step.
"""
import signal
import threading

from .events import BatchEnd, EpochEnd

__all__ = ['DeferredInterrupt']


def _callback_codes():
    """Code objects of the Python functions MXNet calls from C during a training step."""
    try:
        from mxnet.kvstore.kvstore import _updater_wrapper
    except ImportError:  # another MXNet layout: nothing to recognize
        return ()
    return (_updater_wrapper(None).__code__,)


class DeferredInterrupt(BatchEnd, EpochEnd):
    """Context manager for SIGINT during training; ``check()`` raises a deferred Ctrl-C.

    It is also an event handler of ``train()``: after every step and every epoch (last of
    all handlers, after the checkpoint) it calls ``check()``.

    It takes over SIGINT only in the main thread and only while Python's own handler is
    installed (a process started with SIGINT ignored, or a caller with its own handler, is
    left alone); on exit the previous handler comes back.

    Attributes
    ----------
    requested : bool
        True once a Ctrl-C arrived inside an MXNet callback and waits for ``check()``.

    Examples
    --------
    >>> with DeferredInterrupt() as interrupt:
    ...     train(..., event_handlers=[EpochLine(), interrupt])
    """

    priority = float('inf')

    def __init__(self):
        self.requested = False
        self._previous = None
        self._callbacks = _callback_codes()

    def __enter__(self):
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc_info):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
        return False

    def _in_callback(self, frame):
        while frame is not None:
            if frame.f_code in self._callbacks:
                return True
            frame = frame.f_back
        return False

    def _handle(self, signum, frame):
        if self._in_callback(frame):
            self.requested = True  # raised here it would be dropped; check() raises it
        else:
            raise KeyboardInterrupt

    def check(self):
        """Raise ``KeyboardInterrupt`` if a Ctrl-C is waiting."""
        if self.requested:
            self.requested = False
            raise KeyboardInterrupt

    def batch_end(self, estimator, *args, **kwargs):
        self.check()
        return False

    def epoch_end(self, estimator, *args, **kwargs):
        self.check()
        return False
