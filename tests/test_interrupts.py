import ctypes
import os
import signal
import subprocess
import sys

import pytest
from mxnet.kvstore.kvstore import _updater_wrapper

from gluon_mgpu.handlers.interrupts import DeferredInterrupt

# What MXNet's kvstore hands to C as the optimizer: key, two NDArray handles, a void pointer.
_UPDATER_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.c_void_p)


def _ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)


def _mxnet_style_callback(work, monkeypatch):
    """A ctypes callback made as MXNet makes the kvstore's updater (``_updater_wrapper``)."""
    import mxnet.kvstore.kvstore as kvstore
    monkeypatch.setattr(kvstore, '_ndarray_cls', lambda handle: None)  # no arrays here

    def updater(key, lhs, rhs):
        work()
    return _UPDATER_TYPE(_updater_wrapper(updater))


def test_outside_mxnets_callbacks_ctrl_c_stops_at_once():
    with pytest.raises(KeyboardInterrupt):
        with DeferredInterrupt():
            _ctrl_c()
            sum(range(10))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_inside_mxnets_updater_callback_ctrl_c_waits_for_check(monkeypatch):
    calls = []

    def work():
        _ctrl_c()
        calls.append('went on')  # the handler only noted the Ctrl-C
    callback = _mxnet_style_callback(work, monkeypatch)
    with DeferredInterrupt() as interrupt:
        callback(0, None, None, None)
        assert calls == ['went on'] and interrupt.requested
        with pytest.raises(KeyboardInterrupt):
            interrupt.batch_end(None, batch=None)  # as train() calls it after a step
        assert not interrupt.requested
        assert interrupt.check() is None


def test_an_ignored_sigint_stays_ignored():
    # A process started with SIGINT ignored (nohup-like) is left alone.
    code = ('import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\n'
            'from gluon_mgpu.handlers.interrupts import DeferredInterrupt\n'
            'with DeferredInterrupt():\n'
            '    print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)\n')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == 'True', out.stderr


@pytest.mark.parametrize('where, code, python_says', [
    ('a ctypes callback (the kvstore updater)',
     'cb = ctypes.CFUNCTYPE(None)(lambda: (ctrl_c(), sum(range(10))))\ncb()\n',
     'Exception ignored on calling ctypes callback function'),
    ('a __del__ (an NDArray freed)',
     'class Freed:\n    def __del__(self):\n        ctrl_c(); sum(range(10))\nFreed()\n',
     'Exception ignored in')])
def test_without_it_python_drops_a_ctrl_c_inside(where, code, python_says):
    # The failures DeferredInterrupt exists for, shown in a fresh process.
    code = ('import ctypes, os, signal\n'
            'def ctrl_c():\n    os.kill(os.getpid(), signal.SIGINT)\n'
            + code + 'print("still running after Ctrl-C")\n')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout == 'still running after Ctrl-C\n', where
    assert python_says in out.stderr


class _Freed:
    """An object whose ``__del__`` runs when it is freed, as an NDArray's frees its handle."""

    def __init__(self, work):
        self.work = work

    def __del__(self):
        self.work()


def test_inside_a_del_ctrl_c_waits_for_check():
    # A Ctrl-C that lands while the garbage collector frees an NDArray would be printed as
    # "Exception ignored in: <function NDArray.__del__ ...>" and dropped: the run went on.
    calls = []

    def work():
        _ctrl_c()
        calls.append('went on')
    with DeferredInterrupt() as interrupt:
        _Freed(work)  # freed at once
        assert calls == ['went on'] and interrupt.requested
        with pytest.raises(KeyboardInterrupt):
            interrupt.epoch_end(None)

