import _thread
import threading
import time

import mxnet as mx
import pytest
from mxnet import autograd

from gluon_mgpu.runtime.dispatch import call


def test_every_device_issues_from_one_thread_of_its_own():
    first = [call(mx.cpu(i), threading.current_thread) for i in (0, 1)]
    again = [call(mx.cpu(i), threading.current_thread) for i in (0, 1)]
    assert first == again
    assert first[0] is not first[1] and threading.current_thread() not in first
    assert [t.name for t in first] == ['gluon_mgpu cpu(0)', 'gluon_mgpu cpu(1)']
    assert all(t.daemon for t in first)


def test_the_callers_autograd_state_holds_in_the_call_and_only_there():
    def state():
        return autograd.is_recording(), autograd.is_training()
    with autograd.record():
        assert call(mx.cpu(1), state) == (True, True)
    with autograd.record(train_mode=False):
        assert call(mx.cpu(1), state) == (True, False)
    with autograd.train_mode():
        assert call(mx.cpu(1), state) == (False, True)
    assert call(mx.cpu(1), state) == (False, False)


def test_what_the_call_returns_or_raises_reaches_the_caller():
    assert call(mx.cpu(0), divmod, 7, 2) == (3, 1)
    with pytest.raises(ZeroDivisionError, match='integer (division or )?modulo by zero'):
        call(mx.cpu(0), divmod, 7, 0)
    assert call(mx.cpu(0), divmod, 9, 4) == (2, 1)    # the thread survived the error


def test_a_call_from_inside_a_call_runs_in_place_instead_of_waiting_for_itself():
    outer = call(mx.cpu(0), threading.current_thread)
    assert call(mx.cpu(0), call, mx.cpu(0), threading.current_thread) is outer


def test_ctrl_c_while_waiting_is_raised_after_the_call_has_finished():
    finished = []

    def slow():
        time.sleep(0.5)
        finished.append(True)
    timer = threading.Timer(0.05, _thread.interrupt_main)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        call(mx.cpu(1), slow)
    # The caller's next MXNet call cannot overlap the device thread's: it had finished.
    assert finished == [True]
    timer.join()


def test_a_forked_child_issues_from_threads_of_its_own():
    import os
    import select
    import signal
    call(mx.cpu(0), threading.get_ident)  # the parent's thread for cpu(0) exists
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's device threads do not exist here
        try:
            child = call(mx.cpu(0), threading.get_ident)
            os.write(write, b'%d' % (child != threading.get_ident()))
        finally:
            os._exit(0)
    os.close(write)
    # Submitting to the parent's thread would wait forever: give the child 30 s.
    ready, _, _ = select.select([read], [], [], 30)
    if not ready:
        os.kill(pid, signal.SIGKILL)
    with os.fdopen(read) as f:
        answer = f.read() if ready else 'no answer in 30 s'
    os.waitpid(pid, 0)
    assert answer == '1'


def test_a_device_that_is_not_a_context_is_named():
    with pytest.raises(TypeError) as e:
        call('cpu(1)', threading.current_thread)
    assert str(e.value) == ("device must be an mxnet.Context such as mx.cpu(1) or mx.gpu(0), "
                            "got 'cpu(1)'")
