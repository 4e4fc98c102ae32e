import os
import signal
import subprocess
import sys

import pytest

from gluon_mgpu.interrupts import DeferredInterrupt


def _ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)


def test_the_first_ctrl_c_is_noted_and_raised_by_check():
    with DeferredInterrupt() as interrupt:
        _ctrl_c()  # delivered here; no exception in this frame
        assert interrupt.requested
        with pytest.raises(KeyboardInterrupt):
            interrupt.check(1, 2)  # hooks pass their own arguments
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_second_ctrl_c_raises_at_once():
    with pytest.raises(KeyboardInterrupt):
        with DeferredInterrupt():
            _ctrl_c()
            _ctrl_c()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_ctrl_c_check_does_nothing():
    with DeferredInterrupt() as interrupt:
        assert interrupt.check() is None and not interrupt.requested


def test_an_ignored_sigint_stays_ignored():
    # A process started with SIGINT ignored (nohup-like) is left alone.
    code = ('import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\n'
            'from gluon_mgpu.interrupts import DeferredInterrupt\n'
            'with DeferredInterrupt():\n'
            '    print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)\n')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == 'True', out.stderr


def test_an_interrupt_requested_in_a_ctypes_callback_is_not_lost():
    # What MXNet's kvstore does: the optimizer runs as a Python callback called from C. A
    # KeyboardInterrupt raised inside it would be printed and dropped; a noted one is not.
    import ctypes
    callback_type = ctypes.CFUNCTYPE(None)
    calls = []

    def updater():
        _ctrl_c()
        calls.append(1)  # runs: the handler only noted the Ctrl-C
    callback = callback_type(updater)
    with DeferredInterrupt() as interrupt:
        callback()
        assert calls == [1] and interrupt.requested
        with pytest.raises(KeyboardInterrupt):
            interrupt.check()


def test_without_it_a_ctrl_c_inside_a_ctypes_callback_is_dropped():
    # The failure DeferredInterrupt exists for, shown in a fresh process.
    code = ('import ctypes, os, signal\n'
            'cb = ctypes.CFUNCTYPE(None)(lambda: (os.kill(os.getpid(), signal.SIGINT), '
            'sum(range(10))))\n'
            'cb()\n'
            'print("still running after Ctrl-C")\n')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout == 'still running after Ctrl-C\n'
    assert 'Exception ignored on calling ctypes callback function' in out.stderr
