"""The port is the book: the chapter's own train (In [6]) as printed, with its own network, beside
gluon_mgpu.train and the train command, over whole epochs that end with a short batch.

The runs are tiny (conftest.book_equality); ``python -m gluon_mgpu.compare`` runs the same
comparison on 4 batches of 32 per device (tests/test_compare.py, slow)."""
import os

import mxnet as mx
import numpy as np
import pytest

import gluon_mgpu
from gluon_mgpu.commands import compare


@pytest.fixture(params=[1, 2], ids=['1-device', '2-devices'])
def whole_epochs(request, book_equality):
    """``compare.epoch_equality`` on 1 or 2 devices with tiny batches (4 of 8 per device and a
    short one of 4), and the train command's checkpoints of the same run (conftest)."""
    return book_equality(request.param)


def _equal(a, b):
    return len(a) == len(b) and all(x.dtype == y.dtype and np.array_equal(x, y)
                                    for x, y in zip(a, b))


def test_every_epoch_ends_with_a_short_batch(whole_epochs):
    n = whole_epochs['n']
    assert whole_epochs['sizes'] == ([8 * n] * 4 + [4]) * compare.EQUALITY_EPOCHS


def test_the_books_train_and_ours_are_bit_equal_over_whole_epochs(whole_epochs):
    assert whole_epochs['steps'] == 5 * compare.EQUALITY_EPOCHS
    # 76 trained arrays and 34 BatchNorm running statistics (17 layers) on each device.
    assert whole_epochs['arrays'] == (76, 34)
    assert whole_epochs['loss'] == 0.0
    assert whole_epochs['trained'] == 0.0
    assert whole_epochs['running'] == 0.0


def test_each_epochs_test_accuracy_is_the_books(whole_epochs):
    pairs = whole_epochs['test_acc']
    assert len(pairs) == compare.EQUALITY_EPOCHS
    assert all(book == ours for book, ours in pairs)
    # 40 test images: k/40 exactly (the book's own quotient is a float32 under numpy 2's rules)
    assert all(ours in {k / 40 for k in range(41)} for _, ours in pairs)
    if whole_epochs['n'] == 1:  # one device: our evaluation is the book's
        assert [r['test_acc'] for r in whole_epochs['history']] == [b for b, _ in pairs]
    printed = whole_epochs['book_printed']
    assert printed[0] == 'running on: %s' % [mx.cpu(i) for i in range(whole_epochs['n'])]
    assert [line.split(', test_acc ')[1] for line in printed[1:]] == [
        '%.2f' % b for b, _ in pairs]


def test_the_train_command_is_bit_equal_too(whole_epochs):
    for ours, checkpoint in zip(whole_epochs['ours_arrays'], whole_epochs['checkpoints']):
        assert len(ours) == 110 * whole_epochs['n']
        assert _equal(ours, checkpoint['arrays'])
    recorded = whole_epochs['checkpoints'][-1]['record']['history']
    for field in ('test_acc', 'train_loss', 'train_acc'):
        assert [r[field] for r in recorded] == [r[field] for r in whole_epochs['history']]


def test_the_checkpoints_name_the_books_step(whole_epochs):
    for checkpoint in whole_epochs['checkpoints']:
        assert checkpoint['record']['step'] == 'trainer.step(batch_size)'
        assert checkpoint['record']['format'] == 'gluon_mgpu checkpoint 4'


def test_the_step_row_of_compare_says_bit_for_bit(data_dir, two_cpus, monkeypatch):
    found = {'sizes': [64] * 4 + [16], 'steps': 10, 'loss': 0.0, 'trained': 0.0,
             'running': 0.0, 'arrays': (76, 34), 'test_acc': [(0.1, 0.1), (0.125, 0.125)]}
    monkeypatch.setattr(compare, 'epoch_equality', lambda devices, data_dir: found)
    row = compare.step_row(two_cpus, data_dir)
    assert (row['cell'], row['verdict']) == ('In [6]', 'match (bit for bit)')
    assert row['what'] == "the book's train, 2 epochs of 5 batches (64, ..., 16) on 2 devices"
    assert row['diff'] == ('max abs 0.0e+00 (losses, 76 + 34 arrays per device); test_acc '
                           '0.100 vs 0.100, 0.125 vs 0.125')
    found['test_acc'][1] = (0.125, 0.13)
    assert compare.step_row(two_cpus, data_dir)['verdict'] == 'MISMATCH'


def test_the_step_row_of_the_shared_run_says_bit_for_bit(book_equality, two_cpus, data_dir,
                                                         monkeypatch):
    # The tiny run above (conftest), judged as the command judges its own; here, where the
    # worker that trained it for the tests above holds it.
    found = book_equality(2)  # trained before epoch_equality, which it calls, is replaced
    monkeypatch.setattr(compare, 'epoch_equality', lambda devices, data_dir: found)
    row = compare.step_row(two_cpus, data_dir)
    assert row['what'] == "the book's train, 2 epochs of 5 batches (16, ..., 4) on 2 devices"
    assert row['verdict'] == 'match (bit for bit)'
    assert row['diff'].startswith('max abs 0.0e+00 (losses, 76 + 34 arrays per device); '
                                  'test_acc ')


def test_the_books_loader_gives_our_examples_in_another_order(data_dir, monkeypatch):
    """d2lzh.load_data_fashion_mnist, the chapter's data, on the same files (MXNet's download
    replaced by the local path: its copies are compressed otherwise, the images the same)."""
    import d2lzh
    from mxnet.gluon.data.vision import datasets

    monkeypatch.setattr(datasets, 'download',
                        lambda url, path, sha1_hash: os.path.join(path, url.rsplit('/', 1)[1]))
    book_train, book_test = d2lzh.load_data_fashion_mnist(512, root=data_dir)
    ours_train, ours_test = gluon_mgpu.load_data_fashion_mnist(512, data_dir=data_dir, seed=0)

    def epoch(batches):
        sizes, X, y = [], [], []
        for X_b, y_b in batches:
            sizes.append(X_b.shape[0])
            X.append(X_b.asnumpy())
            y.append(y_b.asnumpy())
        return sizes, np.concatenate(X), np.concatenate(y), X_b.dtype, y_b.dtype

    book, ours = epoch(book_train), epoch(ours_train)
    # 60,000 = 117 x 512 + 96: both end the epoch with the short batch, in float32 and int32.
    assert book[0] == ours[0] == [512] * 117 + [96]
    assert book[3:] == ours[3:] == (np.float32, np.int32)
    # The same 60,000 examples, in another order: the book's shuffle draws from numpy's global
    # generator, ours from (seed, epoch).
    assert not np.array_equal(book[2], ours[2])
    def rows(X, y):  # each example as the bytes of its pixels and its label, sorted
        both = np.concatenate([X.reshape(len(X), -1), y.view(np.float32)[:, None]], axis=1)
        return np.sort(both.view(np.dtype((np.void, both.shape[1] * 4))).ravel())
    assert np.array_equal(rows(*book[1:3]), rows(*ours[1:3]))
    # The test set in the same order, unshuffled.
    book, ours = epoch(book_test), epoch(ours_test)
    assert book[0] == ours[0] == [512] * 19 + [272]
    assert np.array_equal(book[1], ours[1]) and np.array_equal(book[2], ours[2])
