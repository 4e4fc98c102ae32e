import os
import signal
import subprocess
import sys

import pytest

from gluon_mgpu.handlers.interrupts import DeferredInterrupt, Interrupted
from gluon_mgpu.runtime import startup


def _ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)


def test_outside_mxnets_callbacks_ctrl_c_stops_at_once():
    with pytest.raises(KeyboardInterrupt):
        with DeferredInterrupt():
            _ctrl_c()
            sum(range(10))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_one_interrupted_for_every_command():
    # The launcher, the commands and DeferredInterrupt raise the same class, worded once.
    assert Interrupted is startup.Interrupted
    e = Interrupted(signal.SIGTERM)
    assert (e.signum, e.signal_name, e.exit_code, e.words) == (15, 'SIGTERM', 143,
                                                                'terminated (SIGTERM)')
    assert Interrupted().words == 'interrupted (Ctrl-C)' and isinstance(e, KeyboardInterrupt)
    import gluon_mgpu.commands.launch as launch
    assert not hasattr(launch, '_Interrupted')


def test_an_ignored_sigint_stays_ignored():
    # A process started with SIGINT ignored (nohup-like) is left alone.
    code = ('import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\n'
            'from gluon_mgpu.handlers.interrupts import DeferredInterrupt\n'
            'with DeferredInterrupt():\n'
            '    print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)\n')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == 'True', out.stderr


def test_without_it_python_drops_a_ctrl_c_inside_a_del():
    # The failure DeferredInterrupt exists for (an NDArray freed), shown in a fresh process.
    code = ('import os, signal\n'
            'def ctrl_c():\n    os.kill(os.getpid(), signal.SIGINT)\n'
            'class Freed:\n    def __del__(self):\n        ctrl_c(); sum(range(10))\nFreed()\n'
            'print("still running after Ctrl-C")\n')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout == 'still running after Ctrl-C\n'
    assert 'Exception ignored in' in out.stderr


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


def test_a_signal_still_waiting_when_the_block_ends_is_raised_then():
    # book_table.py's SIGTERM landed while a diagnosis freed its NDArrays, no check() came
    # after it, and the run went on to exit 0.
    with pytest.raises(KeyboardInterrupt) as raised:
        with DeferredInterrupt() as interrupt:
            _Freed(_ctrl_c)
            assert interrupt.requested
    assert not interrupt.requested and raised.value.signum == signal.SIGINT
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

