"""The notebook "three ways to split training", English and Chinese, run headless in quick mode.

Each is executed once (``GLUON_MGPU_QUICK=1``, by a kernel running this interpreter, with the
repository first on the path); the tests then read what its cells printed and check it
against the book, against one device and against the package's own numbers.
"""
import os
import re

import mxnet as mx
import nbformat
import pytest
from mxnet import nd
from nbclient import NotebookClient

from gluon_mgpu.model import resnet18
from gluon_mgpu.parallel import channels, data_parallel_summary, init_one_device, layers, scratch
from gluon_mgpu.replicas.placement import format_bytes

# Executing both notebooks (and each training cell twice): make test-slow. The methods they run
# keep their fast tests (test_parallel_*.py).
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = {'en': 'three-ways-to-split.ipynb', 'zh': 'three-ways-to-split.zh.ipynb'}
EPOCH = re.compile(r'^epoch 1, training time: \d+\.\d sec, test_acc [01]\.\d\d$', re.M)


@pytest.fixture(scope='module', params=sorted(NOTEBOOKS))
def printed(request):
    """``{cell tag: what the cell printed}`` of the executed notebook."""
    nb = nbformat.read(os.path.join(ROOT, 'notebooks', NOTEBOOKS[request.param]), as_version=4)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv('GLUON_MGPU_QUICK', '1')
        mp.setenv('PYTHONPATH', os.pathsep.join(
            p for p in (ROOT, os.environ.get('PYTHONPATH')) if p))
        NotebookClient(nb, timeout=600, kernel_name='python3',
                       resources={'metadata': {'path': ROOT}}).execute()
    out = {}
    for cell in nb.cells:
        if cell.cell_type == 'code':
            out[cell.metadata['tags'][0]] = ''.join(
                o.text for o in cell.outputs if o.output_type == 'stream' and o.name == 'stdout')
            assert not [o for o in cell.outputs if o.output_type == 'error'], cell.source
    return out


def _devices(printed):
    return re.search(r'^devices: \[(.*)\]$', printed['imports'], re.M).group(1).split(', ')


def _number(pattern, text):
    return float(re.search(pattern, text).group(1))


def test_the_books_allreduce_example(printed):
    d0, d1 = _devices(printed)
    assert printed['allreduce'] == (
        'before allreduce: [\n[[1. 1.]]\n<NDArray 1x2 @%s>, \n[[2. 2.]]\n<NDArray 1x2 @%s>]\n'
        'after allreduce: [\n[[3. 3.]]\n<NDArray 1x2 @%s>, \n[[3. 3.]]\n<NDArray 1x2 @%s>]\n'
        % (d0, d1, d0, d1))


def test_scratch_equals_gluons_trainer(printed):
    assert _number(r'largest parameter difference (\S+)', printed['scratch-vs-gluon']) <= 1e-6


def test_every_method_trains_with_the_books_output_line(printed):
    for tag in ('train-scratch', 'layers-train', 'channels-train'):
        assert 'running on: [%s]\n' % ', '.join(_devices(printed)) in printed[tag]
        assert len(EPOCH.findall(printed[tag])) == 1, printed[tag]
    saved, split = re.search(r'ordinary ResNet-18: test_acc (\S+) \(split: (\S+)\)',
                             printed['layers-train']).groups()
    assert saved == split


def test_layer_split_placement_and_equality(printed):
    d0, d1 = _devices(printed)
    assert printed['layers-split'].splitlines()[:3] == [
        '%s: stem, stage1, stage2, stage3 | %s: stage4, head' % (d0, d1),
        '%s: 82 parameters, 10.6 MiB (24.9%%)' % d0, '%s: 28 parameters, 32.1 MiB (75.1%%)' % d1]
    loss, one = re.search(r'loss (\S+), one device (\S+);', printed['layers-equal']).groups()
    assert loss == one
    assert _number(r'largest gradient difference (\S+)', printed['layers-equal']) == 0.0


def test_where_to_cut_table(printed):
    rows = {line.split()[0]: line for line in printed['layers-cuts'].splitlines()[1:]}
    assert rows['stage2'].split()[1:6] == ['2.6', 'MiB', '|', '40.1', 'MiB']
    assert rows['stage2'].endswith(format_bytes(2 * 64 * 128 * 14 * 14 * 4))
    assert rows['stage3'].split()[1:6] == ['10.6', 'MiB', '|', '32.1', 'MiB']
    assert rows['stage3'].endswith(format_bytes(2 * 64 * 256 * 7 * 7 * 4))


def test_micro_batches(printed):
    lines = printed['layers-micro'].splitlines()
    assert [line.split()[0] for line in lines] == ['2', '8']
    for line in lines:
        assert _number(r'LeNet (\S+),', line) <= 1e-5
        assert _number(r'\(BatchNorm\) (\S+)$', line) > 0.1


def test_channel_split_placement_and_equality(printed):
    d0, d1 = _devices(printed)
    assert printed['channels-split'].splitlines()[:3] == [
        '38 layers split by channels over %s, %s (first layer: 32 | 32)' % (d0, d1),
        '%s: 110 parameters, 21.3 MiB (50.0%%)' % d0, '%s: 110 parameters, 21.3 MiB (50.0%%)' % d1]
    text = printed['channels-equal']
    assert _number(r'relative logits difference (\S+);', text) <= 1e-5
    loss, one = map(float, re.search(r'loss (\S+), one device (\S+)$', text, re.M).groups())
    assert abs(loss - one) <= 1e-6 * one


def test_the_summary_table_is_the_packages(printed):
    """The table at batch 64 equals the package's summaries at batch 4, scaled by 16."""
    devices = [mx.cpu(i) for i in range(2)]
    if _devices(printed) != [str(d) for d in devices]:
        pytest.skip('the notebook ran on GPUs; this check recomputes on CPU contexts')
    X = nd.zeros((4, 1, 28, 28))
    replicated = resnet18(10)
    replicated.initialize(ctx=devices)
    for d in devices:
        replicated(X.as_in_context(d))
    expected = [
        ('data', data_parallel_summary(replicated, devices, X), False),
        ('scratch', scratch.ScratchDataParallel(devices, 0.1).summary(X), False),
        ('layers, cut params', layers.LayerSplit(init_one_device(resnet18(10)), devices, 0.1)
         .summary(X), True),
        ('layers, cut after stage2', layers.LayerSplit(init_one_device(resnet18(10)), devices,
                                                       0.1, cut=('stage2',)).summary(X), True),
        ('channels', channels.ChannelSplitNet(init_one_device(resnet18(10)), devices, 0.1)
         .summary(X), True)]
    lines = printed['summary-table'].splitlines()[1:]
    assert len(lines) == len(expected)
    for line, (name, s, copies_scale) in zip(lines, expected):
        assert line.startswith(name)
        cells = re.split(r'\s{2,}', line.strip())
        assert cells[1] == ' | '.join(format_bytes(b) for b in s['parameter_bytes'])
        assert cells[2] == ' | '.join(format_bytes(16 * b) for b in s['activation_bytes'])
        assert cells[3] == format_bytes(s['copied_bytes_per_step'] * (16 if copies_scale else 1))


def _cells(monkeypatch, tmp_path, checkpoints, tag, seed):
    """The English notebook's imports, ``train`` and training cell ``tag``, run here for 3 epochs
    on the quick look's 64 images, with ``GLUON_MGPU_CHECKPOINTS`` (``make notebooks``') set to
    ``checkpoints`` and MXNet seeded with ``seed`` before the network is made."""
    nb = nbformat.read(os.path.join(ROOT, 'notebooks', NOTEBOOKS['en']), as_version=4)
    monkeypatch.setenv('GLUON_MGPU_QUICK', '1')
    monkeypatch.setenv('GLUON_MGPU_CHECKPOINTS', str(checkpoints))
    monkeypatch.setattr('tempfile.tempdir', str(tmp_path))
    namespace = {}
    for name in ('imports', 'train-function', tag):
        if name == tag:
            mx.random.seed(seed)
            namespace['num_epochs'] = namespace['resnet_epochs'] = 3
        cell = [c for c in nb.cells if name in c.metadata.get('tags', [])]
        exec(cell[0].source, namespace)
    return namespace


@pytest.mark.parametrize('tag, name, result', [('train-scratch', 'scratch', 'scratch_acc'),
                                               ('layers-train', 'layers', 'split_acc'),
                                               ('channels-train', 'channels', 'channels_acc')])
def test_a_training_cell_executed_again_goes_on_after_its_last_kept_epoch(
        monkeypatch, tmp_path, capsys, tag, name, result):
    from gluon_mgpu.handlers.checkpoint_names import checkpoint_path, list_checkpoints
    full, cut = tmp_path / 'full', tmp_path / 'cut'
    whole = _cells(monkeypatch, tmp_path, full, tag, 0)
    printed = capsys.readouterr().out
    assert list_checkpoints(str(full / name)) == [1, 2, 3]
    assert len(re.findall(r'^epoch \d, training time', printed, re.M)) == 3
    # Stopped after epoch 1, executed again from another initialization: the kept epoch's
    # parameters replace it, epoch 1's line is printed as recorded, and epochs 2 and 3 train
    # on their own data order, to the very bytes of the uninterrupted run.
    os.makedirs(str(cut / name))
    for kind in ('params', 'json'):
        os.link(checkpoint_path(str(full / name), 1, kind),
                checkpoint_path(str(cut / name), 1, kind))
    again = _cells(monkeypatch, tmp_path, cut, tag, 5)
    resumed = capsys.readouterr().out
    assert again[result] == whole[result]
    first = printed.splitlines()
    assert resumed.splitlines()[:3] == first[:3]  # devices, running on, epoch 1 as recorded
    timeless = [re.sub(r'time: \d+\.\d sec', 'time', line) for line in first]
    assert [re.sub(r'time: \d+\.\d sec', 'time', line) for line in resumed.splitlines()] == timeless
    with open(checkpoint_path(str(full / name), 3, 'params'), 'rb') as a, \
            open(checkpoint_path(str(cut / name), 3, 'params'), 'rb') as b:
        assert a.read() == b.read()
    # All epochs kept: nothing trains, the lines are printed as recorded.
    assert _cells(monkeypatch, tmp_path, full, tag, 9)[result] == whole[result]
    assert capsys.readouterr().out == printed
