"""Ctrl-C during training: stop between two steps, never inside MXNet.

With the default kvstore, ``trainer.step`` runs the optimizer as a Python function that MXNet
calls back through ctypes, once per parameter, on the main thread. A Ctrl-C whose
``KeyboardInterrupt`` is raised inside such a callback is printed as "Exception ignored on
calling ctypes callback function" and dropped: the run goes on as if nothing happened. So the
command-line tools catch the first Ctrl-C themselves, note it, and raise ``KeyboardInterrupt``
from their own hooks, after the step in progress (or after the epoch's evaluation). A second
Ctrl-C raises at once, as usual.
"""
import signal
import threading

__all__ = ['DeferredInterrupt']


class DeferredInterrupt:
    """Context manager: the first SIGINT sets ``requested``; ``check()`` then raises.

    It takes over SIGINT only in the main thread and only while Python's own handler is
    installed (a process started with SIGINT ignored, or a caller with its own handler, is
    left alone); on exit the previous handler comes back.

    Examples
    --------
    >>> with DeferredInterrupt() as interrupt:
    ...     train(..., on_step=lambda epoch, step: interrupt.check())
    """

    def __init__(self):
        self.requested = False
        self._previous = None

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

    def _handle(self, signum, frame):
        if self.requested:  # the second Ctrl-C: do not wait
            raise KeyboardInterrupt
        self.requested = True

    def check(self, *args):
        """Raise ``KeyboardInterrupt`` if Ctrl-C was pressed; takes any hook arguments."""
        if self.requested:
            raise KeyboardInterrupt
