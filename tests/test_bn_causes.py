"""benchmarks/bn_causes.py: the three causes of docs/book-comparison.md's "Do our runs sit low?",
tested on one saved state."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'benchmarks'))
import bn_causes  # noqa: E402

# A test of a script in benchmarks/ (the project measuring itself): make bench-test.
pytestmark = pytest.mark.bench

# 56 = 3 x 16 + 8: the epoch ends with a short batch, as Fashion-MNIST's does.
RUN = ['--batch-size', '16', '--train-limit', '56', '--test-limit', '32', '--seed', '4',
       '--epochs', '1', '--quiet']


def test_mxnet_updates_the_running_variance_with_the_biased_variance_on_the_cpu():
    # What the page's cuDNN row rests on: cuDNN keeps the unbiased one.
    check = bn_causes.biased_update_check()
    assert check['biased'] < 1e-5 < 1e-4 < check['unbiased']


def test_cudnn_variance_scales_every_running_variance_and_no_mean():
    # The first run's correction matched no layer (names of another copy of the network), so it
    # read the saved statistics unchanged: a name it does not know is now a KeyError.
    stats = {'1.running_mean': 2.0, '1.running_var': 3.0, '3.0.bn1.running_var': 5.0}
    assert bn_causes.cudnn_variance(stats, {'1.running_var': 4, '3.0.bn1.running_var': 6}) == {
        '1.running_mean': 2.0, '1.running_var': 4.0, '3.0.bn1.running_var': 6.0}
    with pytest.raises(KeyError):
        bn_causes.cudnn_variance(stats, {'batchnorm0_running_var': 4})


def _causes(folder, data_dir, output):
    return subprocess.run([sys.executable, os.path.join(ROOT, 'benchmarks', 'bn_causes.py'),
                           '--checkpoint-dir', folder, '--epoch', '1', '--test-limit', '32',
                           '--batches', '2', '--data-dir', data_dir, '--output', output],
                          capture_output=True, text=True, timeout=600)


def test_each_cause_is_read_on_the_saved_weights_and_a_two_device_run_is_refused(tmp_path,
                                                                                 data_dir):
    for devices in ('1', '2'):
        folder = str(tmp_path / devices)
        done = subprocess.run([sys.executable, '-m', 'gluon_mgpu.train', *RUN, '--num-gpus',
                               devices, '--device', 'cpu', '--data-dir', data_dir,
                               '--checkpoint-dir', folder], capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr
    output = str(tmp_path / 'causes.json')
    done = _causes(str(tmp_path / '1'), data_dir, output)
    assert done.returncode == 0, done.stderr
    with open(output) as f:
        result = json.load(f)
    assert sorted(result['acc']) == ['cudnn_variance', 'fixed_weights_other_order',
                                     'fixed_weights_own_order', 'precise_bn', 'saved',
                                     'without_last_batch']
    assert done.stdout.splitlines()[0] == 'saved %.4f' % result['acc']['saved']
    # Values per channel in the last, short batch of 8: 28x28 at the stem and stage 1, then 14,
    # 7 and 4.
    counts = result['values_per_channel']
    # The BatchNorm layers of the chapter's ResNet-18, named by their place in it, as _stats
    # names them: the stem's, then each residual's two.
    assert len(counts) == 17 and {'1', '3.0.bn1', '3.0.bn2', '6.1.bn2'} <= set(counts)
    assert sorted(set(counts.values())) == [8 * 4 * 4, 8 * 7 * 7, 8 * 14 * 14, 8 * 28 * 28]
    assert done.stdout.splitlines()[2] == 'without_last_batch %.4f (8 images)' % (
        result['acc']['without_last_batch'])
    assert result['batches'] == 2 and result['test_limit'] == 32 and result['seed'] == 4
    refused = _causes(str(tmp_path / '2'), data_dir, str(tmp_path / 'two.json'))
    assert refused.returncode == 2 and not os.path.exists(str(tmp_path / 'two.json'))
    assert refused.stderr.splitlines() == [
        'benchmarks/bn_causes.py: error: --checkpoint-dir %s: a run on 2 devices in float32; '
        'give a 1-device float32 run of the book table' % (tmp_path / '2')]
