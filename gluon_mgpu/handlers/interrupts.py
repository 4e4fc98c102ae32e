"""What MXNet's optimizer callback would swallow: signals that stop a run, the optimizer's errors.

With the default kvstore, ``trainer.step`` runs the optimizer as a Python function that MXNet
calls back through ctypes, once per parameter, on the main thread. An exception raised inside
such a callback is printed as "Exception ignored on calling ctypes callback function" and
dropped: the run goes on as if nothing happened, and the parameters are not updated. Two things
here make sure nothing is lost there:

- ``DeferredInterrupt`` turns SIGINT (Ctrl-C), SIGTERM and SIGHUP (the terminal or the ssh
  connection closed) into ``Interrupted`` (a ``KeyboardInterrupt`` that records the signal) at
  once, as Python does for Ctrl-C, except when the signal arrives inside that callback: then it
  only notes it, and ``check`` raises it right after the step. SIGQUIT (Ctrl-\\) keeps its Unix
  meaning, quit at once, and first prints where every thread is (``faulthandler``): it is what
  ends a run stuck inside MXNet, where the other signals wait for MXNet to return.
- ``guard_updates(trainer)`` catches any exception the optimizer raises during ``step`` (for
  example MXNet's "Out of range value for lr" with ``lr=1e39``) and raises it as
  ``UpdateError`` right after ``trainer.step`` returns.
"""
import faulthandler
import signal
import sys
import threading

from .events import BatchEnd, EpochEnd

__all__ = ['Interrupted', 'DeferredInterrupt', 'STOPPING', 'UpdateError', 'UpdateGuard', 'guard_updates',
           'one_line']


def _callback_codes():
    """Code objects of the Python functions MXNet calls from C during a training step."""
    try:
        from mxnet.kvstore.kvstore import _updater_wrapper
    except ImportError:  # another MXNet layout: nothing to recognize
        return ()
    return (_updater_wrapper(None).__code__,)


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal: SIGINT (Ctrl-C), SIGTERM or SIGHUP.

    A ``KeyboardInterrupt``, so code that handles Ctrl-C handles all three.

    Attributes
    ----------
    signum : int
    signal_name : str
        ``'SIGINT'``, ``'SIGTERM'`` or ``'SIGHUP'``.
    exit_code : int
        What a process killed by the signal reports: 128 + ``signum`` (130, 143, 129).
    """

    def __init__(self, signum=signal.SIGINT):
        self.signum = int(signum)
        super().__init__(self.signal_name)

    @property
    def signal_name(self):
        return signal.Signals(self.signum).name

    @property
    def exit_code(self):
        return 128 + self.signum


# The handler each signal has when nobody took it over; only then is it taken.
_DEFAULTS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL,
             signal.SIGHUP: signal.SIG_DFL}
STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _dump_stacks_on_quit():
    """Make SIGQUIT print every thread's stack on stderr (fd 2 when ``sys.stderr`` is not a
    file, as under pytest) before its default action; whether it could."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            # In C, so it runs even while the main thread is inside MXNet; chain: then the
            # default action ends the process.
            faulthandler.register(signal.SIGQUIT, file=stream, all_threads=True, chain=True)
            return True
        except (AttributeError, ValueError, OSError, RuntimeError):  # no file descriptor
            continue
    return False


class DeferredInterrupt(BatchEnd, EpochEnd):
    """Context manager for the signals that stop a run; ``check()`` raises a deferred one.

    Inside it, SIGINT, SIGTERM or SIGHUP raises ``Interrupted`` (which records the signal) at
    once, or, when it arrives inside MXNet's optimizer callback, at the next ``check()``. It
    takes over a signal only in the main thread and only while the signal has its default
    handler (a process started with SIGINT ignored, one under ``nohup``, or a caller with its
    own handler, is left alone); on exit the previous handlers come back.

    SIGQUIT (Ctrl-\\) is not deferred: it quits at once, as by default (exit code 131, finished
    checkpoints are kept: they are written whole or not at all), after ``faulthandler`` has
    printed every thread's Python stack. A Python handler runs only when MXNet hands control
    back, so SIGINT, SIGTERM and SIGHUP cannot stop a run stuck inside MXNet; SIGQUIT can, and
    says where it was stuck. It is taken over, like the others, only while it has its default
    action. It is also an event handler of ``train()``: after
    every step and every epoch (last of all handlers, after the checkpoint) it calls ``check()``.

    Like Ctrl-C, a SIGTERM takes effect when MXNet hands control back to Python: a process
    blocked inside MXNet for good (a dist worker waiting for a dead peer) still needs SIGKILL.

    Parameters
    ----------
    signals : tuple of int, default (SIGINT, SIGTERM, SIGHUP)

    Attributes
    ----------
    requested : bool
        True once a signal arrived inside an MXNet callback and waits for ``check()``.
    signum : int or None
        That signal.

    Examples
    --------
    >>> with DeferredInterrupt() as interrupt:
    ...     train(..., event_handlers=[EpochLine(), interrupt])
    """

    priority = float('inf')

    def __init__(self, signals=STOPPING):
        for signum in signals:
            if signum not in _DEFAULTS:
                raise ValueError('DeferredInterrupt handles SIGINT, SIGTERM and SIGHUP, got %r; '
                                 'pass signals=(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) or '
                                 'a part of it' % (signum,))
        self.signals = tuple(signals)
        self.requested = False
        self.signum = None
        self._previous = {}
        self._quit_dump = False
        self._callbacks = _callback_codes()

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                if signal.getsignal(signum) is _DEFAULTS[signum]:
                    self._previous[signum] = signal.signal(signum, self._handle)
            if signal.getsignal(signal.SIGQUIT) is signal.SIG_DFL:
                self._quit_dump = _dump_stacks_on_quit()
        return self

    def __exit__(self, *exc_info):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
        if self._quit_dump:
            faulthandler.unregister(signal.SIGQUIT)
            self._quit_dump = False
        return False

    def _in_callback(self, frame):
        while frame is not None:
            if frame.f_code in self._callbacks:
                return True
            frame = frame.f_back
        return False

    def _handle(self, signum, frame):
        if self._in_callback(frame):
            if not self.requested:  # the first signal is the one reported
                self.requested, self.signum = True, signum
        else:
            raise Interrupted(signum)

    def check(self, *args):
        """Raise ``Interrupted`` if a signal is waiting; takes any hook arguments."""
        if self.requested:
            self.requested = False
            signum, self.signum = self.signum, None
            raise Interrupted(signum)

    def batch_end(self, estimator, *args, **kwargs):
        self.check()
        return False

    def epoch_end(self, estimator, *args, **kwargs):
        self.check()
        return False


class UpdateError(RuntimeError):
    """The optimizer raised an exception while ``trainer.step`` updated a parameter.

    The message names the parameter, its device and the original exception (also its
    ``__cause__``); ``original`` is that exception. The updates of that step are incomplete,
    so the run must stop; parameters saved before the step (checkpoints) are untouched.
    """

    def __init__(self, message, original):
        super().__init__(message)
        self.original = original


def one_line(e, limit=300):
    """An exception's message as one line of at most ``limit`` characters.

    MXNet's messages start with a C++ stack trace ("Traceback ...") and end with
    ``MXNetError: message``: the message is kept, without its type prefix.
    """
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    line = lines[-1] if 'Traceback' in lines[0] else lines[0]
    for prefix in ('MXNetError: ', type(e).__name__ + ': '):
        if line.startswith(prefix):
            line = line[len(prefix):]
    return line if len(line) <= limit else line[:limit - 3] + '...'


_GUARDED = []


def _updater_class():
    """MXNet's ``Updater`` with a ``__call__`` that reports to its guard (made once, lazily:
    importing this module does not import MXNet)."""
    if _GUARDED:
        return _GUARDED[0]
    from mxnet.optimizer import Updater

    class GuardedUpdater(Updater):
        """MXNet's ``Updater``, reporting its exceptions to the guard instead of losing them."""

        def __call__(self, index, grad, weight):
            guard = self.__dict__.get('_gluon_mgpu_guard')
            if guard is None:  # the guard was left: behave as MXNet's own
                return Updater.__call__(self, index, grad, weight)
            if guard.pending is not None:
                return None  # the step already failed; the rest of it is skipped
            try:
                return Updater.__call__(self, index, grad, weight)
            except BaseException as e:  # noqa: B036 (KeyboardInterrupt too: C would drop it)
                guard._failed(e, index, weight)
                if sys._getframe(1).f_code not in guard._callbacks:
                    guard.check()  # called from Python (no kvstore updater): raise now
            return None
    _GUARDED.append(GuardedUpdater)
    return GuardedUpdater


class UpdateGuard:
    """Context manager that makes any exception of the optimizer stop ``trainer.step``.

    Use ``guard_updates(trainer)``. Inside the ``with`` block, ``trainer.step`` (and
    ``trainer.update``) raise ``UpdateError`` right after they return when the optimizer
    raised during them, whichever way MXNet called it: from C as the kvstore's updater
    (``update_on_kvstore``, where the exception would be printed and dropped), or from Python
    (``trainer._updaters``: one device, or ``update_on_kvstore=False``). A ``KeyboardInterrupt``
    raised there is re-raised as it is. ``check()`` raises a pending error as well; leaving the
    block restores the Trainer.

    Attributes
    ----------
    pending : BaseException or None
        The error of the current step, until it is raised.
    """

    def __init__(self, trainer):
        self.trainer = trainer
        self.pending = None
        self._callbacks = _callback_codes()
        self._class = _updater_class()
        self._guarded = []
        self._methods = {}

    def _updaters(self):
        t = self.trainer
        found = list(getattr(t, '_updaters', []))
        kv = getattr(t, '_kvstore', None)
        if kv is not None and getattr(kv, '_updater', None) is not None:
            found.append(kv._updater)
        return found

    def _install(self):
        """Guard every updater the Trainer has now (its kvstore is made at the first step)."""
        from mxnet.optimizer import Updater
        for updater in self._updaters():
            if type(updater) is Updater:
                updater.__class__ = self._class
                self._guarded.append(updater)
            if isinstance(updater, self._class):
                updater.__dict__['_gluon_mgpu_guard'] = self

    def _failed(self, error, index, weight):
        if self.pending is not None:
            return
        if not isinstance(error, Exception):
            self.pending = error
            return
        params = getattr(self.trainer, '_params', [])
        first = index[0] if isinstance(index, (list, tuple)) and index else index
        name = params[first].name if isinstance(first, int) and 0 <= first < len(params) \
            else first
        if isinstance(weight, (list, tuple)):
            weight = weight[0] if weight else None
        where = ' on %s' % weight.context if hasattr(weight, 'context') else ''
        more = ' (and %d others)' % (len(index) - 1) \
            if isinstance(index, (list, tuple)) and len(index) > 1 else ''
        message = ('the optimizer failed while updating parameter %s%s%s: %s: %s; the step '
                   'was not completed, so training stops'
                   % (name, more, where, type(error).__name__, one_line(error)))
        self.pending = UpdateError(message, error)
        self.pending.__cause__ = error

    def check(self, *args):
        """Raise the error of the last step, if any (``UpdateError`` or a KeyboardInterrupt)."""
        if self.pending is not None:
            error, self.pending = self.pending, None
            raise error

    def _wrap(self, name):
        method = getattr(self.trainer, name)

        def guarded(*args, **kwargs):
            t = self.trainer
            if not t._kv_initialized:
                # What step does first, in its order (a dist kvstore takes the optimizer with
                # its gradient scale when it is made); then its updater can be guarded.
                if name == 'step':
                    batch_size = args[0] if args else kwargs['batch_size']
                    t._check_and_rescale_grad(t._scale / batch_size)
                t._init_kvstore()
            self._install()
            try:
                result = method(*args, **kwargs)
            except BaseException:
                self.check()  # the optimizer's error is the cause: report it first
                raise
            self.check()
            return result
        guarded.__doc__ = method.__doc__
        return guarded

    def __enter__(self):
        for name in ('step', 'update'):
            self._methods[name] = self.trainer.__dict__.get(name)
            setattr(self.trainer, name, self._wrap(name))
        self._install()
        return self

    def __exit__(self, *exc_info):
        from mxnet.optimizer import Updater
        for name, previous in self._methods.items():
            if previous is None:
                self.trainer.__dict__.pop(name, None)
            else:
                setattr(self.trainer, name, previous)
        self._methods = {}
        for updater in self._guarded:
            updater.__dict__.pop('_gluon_mgpu_guard', None)
            updater.__class__ = Updater
        self._guarded = []
        if exc_info[0] is None:
            self.check()
        return False


def guard_updates(trainer):
    """Return an ``UpdateGuard`` for ``trainer``: use it as ``with guard_updates(trainer):``.

    Examples
    --------
    >>> with guard_updates(trainer):
    ...     trainer.step(batch_size)   # raises UpdateError if the optimizer failed
    """
    return UpdateGuard(trainer)
