import logging

import mxnet as mx
import pytest

import gluon_mgpu
from gluon_mgpu import devices


@pytest.fixture
def gpus(monkeypatch):
    """Pretend the machine has N GPUs (contexts are only names until data is put on them)."""
    def set_count(n):
        monkeypatch.setattr(devices, 'num_gpus', lambda: n)
    return set_count


def _warnings(caplog):
    return [r for r in caplog.records if r.name == 'gluon_mgpu' and r.levelno == logging.WARNING]


def test_try_all_gpus_returns_cpu_without_gpu(gpus):
    gpus(0)
    assert gluon_mgpu.try_all_gpus() == [mx.cpu()]
    assert gluon_mgpu.try_gpu() == mx.cpu()
    assert gluon_mgpu.try_gpu(1) == mx.cpu()


def test_try_all_gpus_lists_every_gpu(gpus):
    gpus(3)
    assert gluon_mgpu.try_all_gpus() == [mx.gpu(0), mx.gpu(1), mx.gpu(2)]
    assert gluon_mgpu.try_gpu(2) == mx.gpu(2)
    assert gluon_mgpu.try_gpu(3) == mx.cpu()


def test_enough_gpus_gives_gpus_and_no_warning(gpus, caplog):
    gpus(4)
    assert gluon_mgpu.get_devices(2) == [mx.gpu(0), mx.gpu(1)]
    assert gluon_mgpu.get_devices(4, 'gpu') == [mx.gpu(i) for i in range(4)]
    # The public signature, by keyword: get_devices(num_gpus, device='auto').
    assert gluon_mgpu.get_devices(num_gpus=3, device='auto') == [mx.gpu(i) for i in range(3)]
    assert _warnings(caplog) == []


def test_no_gpu_falls_back_to_simulated_cpu_devices_with_one_warning(gpus, caplog):
    gpus(0)
    assert gluon_mgpu.get_devices(3) == [mx.cpu(0), mx.cpu(1), mx.cpu(2)]
    warned = _warnings(caplog)
    assert len(warned) == 1
    message = warned[0].getMessage()
    assert '\n' not in message
    assert message.startswith('warning: no GPU found, so [cpu(0), cpu(1), cpu(2)] are '
                              "simulated devices sharing this machine's CPU")


def test_one_device_without_gpu_says_it_runs_on_the_cpu(gpus, caplog):
    gpus(0)
    assert gluon_mgpu.get_devices(1) == [mx.cpu(0)]
    assert [r.getMessage() for r in _warnings(caplog)] == [
        'warning: no GPU found, so training runs on the CPU as [cpu(0)]']


def test_warn_false_gives_the_same_devices_without_the_warning(gpus, caplog):
    gpus(0)
    assert gluon_mgpu.get_devices(1, warn=False) == [mx.cpu(0)]
    assert gluon_mgpu.get_devices(3, warn=False) == [mx.cpu(0), mx.cpu(1), mx.cpu(2)]
    assert _warnings(caplog) == []


def test_fewer_gpus_than_asked_is_an_error_naming_both_numbers(gpus):
    gpus(1)
    with pytest.raises(ValueError, match=r'asked for 3 GPUs but 1 GPU found; pass --num-gpus 1 '
                                         r'\(num_gpus=1\), or use CPU contexts with --device cpu'):
        gluon_mgpu.get_devices(3)


def test_device_gpu_never_falls_back(gpus):
    gpus(0)
    with pytest.raises(ValueError, match=r'asked for 2 GPUs but no GPU was found; install a CUDA '
                                         r'build of MXNet'):
        gluon_mgpu.get_devices(2, device='gpu')


def test_device_cpu_forces_cpu_contexts_without_warning(gpus, caplog):
    gpus(8)
    assert gluon_mgpu.get_devices(2, device='cpu') == [mx.cpu(0), mx.cpu(1)]
    assert _warnings(caplog) == []


@pytest.mark.parametrize('n', [0, -1, 1.5, True, '2'])
def test_bad_counts_are_rejected(n):
    with pytest.raises(ValueError, match=r'num_gpus must be a whole number >= 1, got'):
        gluon_mgpu.get_devices(n)


def test_unknown_device_is_rejected():
    with pytest.raises(ValueError, match=r"device must be one of auto/gpu/cpu, got 'tpu'"):
        gluon_mgpu.get_devices(1, device='tpu')


def test_format_devices_matches_the_books_print():
    assert gluon_mgpu.format_devices([mx.gpu(0), mx.gpu(1)]) == '[gpu(0), gpu(1)]'
    assert gluon_mgpu.format_devices([mx.gpu(0), mx.gpu(1)]) == str([mx.gpu(0), mx.gpu(1)])


@pytest.mark.parametrize('given, expected', [
    ([mx.cpu(0), mx.cpu(1)], True), ([mx.gpu(0), mx.cpu(0), mx.cpu(1)], True),
    (['cpu(0)', 'cpu(1)'], True), ([mx.gpu(0), mx.cpu(0)], False), ([mx.cpu(0)], False),
    ([mx.gpu(0), mx.gpu(1)], False), ([mx.cpu_pinned(0), mx.cpu(0)], False)])
def test_simulated_devices_are_two_or_more_cpu_contexts_among_any_others(given, expected):
    # The two CPU contexts of [gpu(0), cpu(0), cpu(1)] share the cores and MXNet's CPU scratch
    # pool like those of [cpu(0), cpu(1)]: train() issues their calls from a thread each, and
    # the step that issues them from one thread refuses SyncBatchNorm on them.
    assert devices.simulated(given) is expected
    from gluon_mgpu import training
    step = training.train_batch_per_device if expected else training.train_batch
    assert training.choose_step(given) is step
