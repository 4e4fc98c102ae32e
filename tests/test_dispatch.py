import _thread
import re
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



def _trained(step, devices, batches, net):
    from mxnet import gluon
    from gluon_mgpu import training
    trainer = training.init_training(net, devices, 0.2, seed=0)
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    losses = []
    for X, y in batches:
        ls, _, _ = step(net, X, y, loss, trainer, devices, training.split_batch)
        losses.append([l.asnumpy() for l in ls])
    # Each network's layers are numbered on from the last one's: compare them in order.
    return losses, [(re.sub(r'\d+', '', name), [a.asnumpy() for a in p.list_data()])
                    for name, p in net.collect_params().items()]


def test_the_per_device_step_is_the_books_step(two_cpus, data_dir):
    # train() on simulated CPU devices issues each device's calls from its own thread
    # (training.train_batch_per_device); elsewhere it runs the book's train_batch. Same calls in
    # the same order: the losses, every parameter and every running statistic on both devices
    # are equal, bit for bit.
    import numpy as np
    from gluon_mgpu import data, training
    assert training.choose_step(two_cpus) is training.train_batch_per_device
    assert training.choose_step([two_cpus[0]]) is training.train_batch
    assert training.choose_step([mx.gpu(0), mx.gpu(1)]) is training.train_batch
    train_iter, _ = data.load_data_fashion_mnist(32, data_dir=data_dir, train_limit=96,
                                                 test_limit=8, seed=0)
    batches = list(train_iter)
    runs = [_trained(step, two_cpus, batches, training.new_network('resnet18'))
            for step in (training.train_batch, training.train_batch_per_device)]
    (book_losses, book_params), (ours_losses, ours_params) = runs
    assert len(book_losses) == 3
    assert [n for n, _ in book_params] == [n for n, _ in ours_params]
    for a, b in zip(book_losses, ours_losses):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    for (name, a), (_, b) in zip(book_params, ours_params):
        assert len(a) == 2 and all(np.array_equal(x, y) for x, y in zip(a, b)), name
    assert sum('running_mean' in name for name, _ in book_params) == 17


def test_sync_batch_norm_on_cpu_devices_runs_per_device_and_is_refused_from_one_thread(
        two_cpus, data_dir):
    # SyncBatchNorm layers wait for every device inside the step: issued from one thread, two
    # CPU contexts share one scratch pool and deadlock (MXNet 1.9.1). The book's step says so
    # in one line before any step; the per-device step train() picks runs, and both devices
    # end with the same running statistics.
    import numpy as np
    from gluon_mgpu import data, training
    train_iter, _ = data.load_data_fashion_mnist(32, data_dir=data_dir, train_limit=64,
                                                 test_limit=8, seed=0)
    batches = list(train_iter)
    with pytest.raises(ValueError, match=r'^the batch given to train_batch: the network has '
                                         r'SyncBatchNorm layers, .* deadlock .*; run the step '
                                         r'choose_step\(devices\) returns'):
        _trained(training.train_batch, two_cpus, batches,
                 training.new_network('resnet18', sync_bn_devices=2))
    losses, params = _trained(training.train_batch_per_device, two_cpus, batches,
                              training.new_network('resnet18', sync_bn_devices=2))
    assert len(losses) == 2 and all(np.isfinite(l).all() for ls in losses for l in ls)
    stats = [(n, a) for n, a in params if 'running' in n]
    assert len(stats) == 34
    assert all(np.array_equal(a[0], a[1]) for _, a in stats)
