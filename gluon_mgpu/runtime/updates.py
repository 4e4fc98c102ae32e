"""What MXNet would swallow or bury: the optimizer's exceptions inside ``trainer.step``
(``guard_updates``) and the C++ stack trace in its messages (``one_line``). docs/events.md
("Inside trainer.step") explains it.
"""
import functools
import sys

from .checks import one_line

__all__ = ['UpdateError', 'UpdateGuard', 'guard_updates', 'one_line', 'callback_codes']


def callback_codes():
    """Code objects of the Python functions MXNet calls from C during a training step."""
    try:
        from mxnet.kvstore.kvstore import _updater_wrapper
    except ImportError:  # another MXNet layout: nothing to recognize
        return ()
    return (_updater_wrapper(None).__code__,)


class UpdateError(RuntimeError):
    """The optimizer raised ``original`` (also the ``__cause__``) while ``trainer.step`` updated
    the parameter the message names: the step is incomplete, so the run must stop."""

    def __init__(self, message, original):
        super().__init__(message)
        self.original = original


@functools.lru_cache(maxsize=None)
def _updater_class():
    """MXNet's ``Updater`` reporting to its guard (made once, lazily: no MXNet at import)."""
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
    return GuardedUpdater


class UpdateGuard:
    """Context manager (``guard_updates(trainer)``) that makes any exception of the optimizer
    stop ``trainer.step``.

    Inside ``with guard_updates(trainer):``, ``trainer.step`` and ``trainer.update`` raise
    ``UpdateError`` (a ``KeyboardInterrupt`` as it is) right after they return when the
    optimizer raised during them, whether MXNet called it from C as the kvstore's updater,
    where the exception would be dropped, or from Python (``trainer._updaters``). Leaving the
    block restores the Trainer.

    Attributes
    ----------
    pending : BaseException or None
        The error of the current step, until it is raised.
    """

    def __init__(self, trainer):
        self.trainer = trainer
        self.pending = None
        self._callbacks = callback_codes()
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
        indices = index if isinstance(index, (list, tuple)) and index else [index]
        weights = weight if isinstance(weight, (list, tuple)) and weight else [weight]
        params, first = getattr(self.trainer, '_params', []), indices[0]
        name = params[first].name if isinstance(first, int) and 0 <= first < len(params) else first
        where = ' on %s' % weights[0].context if hasattr(weights[0], 'context') else ''
        more = ' (and %d others)' % (len(indices) - 1) if len(indices) > 1 else ''
        message = ('the optimizer failed while updating parameter %s%s%s: %s: %s; the step '
                   'was not completed, so training stops'
                   % (name, more, where, type(error).__name__, one_line(error)))
        self.pending = UpdateError(message, error)
        self.pending.__cause__ = error

    def check(self):
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


guard_updates = UpdateGuard  # with guard_updates(trainer): trainer.step(batch_size)
