import gzip
import os
import struct

import numpy as np
import pytest
from mxnet import nd
from mxnet.gluon.data.vision import transforms

import gluon_mgpu
from gluon_mgpu import data


def _raw(path, header):
    """Independent reader for the test: gunzip and skip the header bytes."""
    with gzip.open(path, 'rb') as f:
        return np.frombuffer(f.read(), dtype=np.uint8)[header:]


def test_batches_equal_the_raw_idx_bytes(data_dir):
    train_iter, test_iter = gluon_mgpu.load_data_fashion_mnist(
        100, data_dir=data_dir, train_limit=300, test_limit=250, seed=7)
    raw_x = _raw(os.path.join(data_dir, 't10k-images-idx3-ubyte.gz'), 16).reshape(-1, 28, 28)
    raw_y = _raw(os.path.join(data_dir, 't10k-labels-idx1-ubyte.gz'), 8)
    assert len(raw_y) == 10000
    batches = list(test_iter)
    assert [b[0].shape for b in batches] == [(100, 1, 28, 28)] * 2 + [(50, 1, 28, 28)]
    X = np.concatenate([b[0].asnumpy() for b in batches])
    y = np.concatenate([b[1].asnumpy() for b in batches])
    assert X.dtype == np.float32 and y.dtype == np.int32
    assert np.array_equal(X[:, 0], raw_x[:250] / np.float32(255))
    assert np.array_equal(y, raw_y[:250])
    assert X.min() == 0.0 and X.max() == 1.0
    # The first test image is an ankle boot (label 9), as in every Fashion-MNIST release.
    assert gluon_mgpu.get_fashion_mnist_labels(y[:1]) == ['ankle boot']

    train_raw_x = _raw(os.path.join(data_dir, 'train-images-idx3-ubyte.gz'), 16)
    train_raw_x = train_raw_x.reshape(-1, 28, 28)
    train_raw_y = _raw(os.path.join(data_dir, 'train-labels-idx1-ubyte.gz'), 8)
    order = train_iter.order(0)
    X0, y0 = next(iter(train_iter))
    assert sorted(order) == list(range(300)) and list(order[:5]) != list(range(5))
    assert np.array_equal(X0.asnumpy()[:, 0], train_raw_x[order[:100]] / np.float32(255))
    assert np.array_equal(y0.asnumpy(), train_raw_y[order[:100]])


def test_pixels_equal_gluon_to_tensor(data_dir):
    images, _ = data.load_fashion_mnist_arrays('test', data_dir)
    ours = data.to_tensor(images[:8])
    to_tensor = transforms.ToTensor()
    for i in range(8):
        theirs = to_tensor(nd.array(images[i][:, :, None], dtype='uint8')).asnumpy()
        assert theirs.dtype == np.float32
        assert np.array_equal(ours[i], theirs)


def test_shuffle_is_seeded_per_epoch_and_covers_every_example(data_dir):
    a, _ = gluon_mgpu.load_data_fashion_mnist(64, data_dir=data_dir, train_limit=200,
                                              test_limit=10, seed=3)
    b, _ = gluon_mgpu.load_data_fashion_mnist(64, data_dir=data_dir, train_limit=200,
                                              test_limit=10, seed=3)
    assert len(a) == 4
    epochs_a = [np.concatenate([y.asnumpy() for _, y in a]) for _ in range(2)]
    epochs_b = [np.concatenate([y.asnumpy() for _, y in b]) for _ in range(2)]
    assert [len(e) for e in epochs_a] == [200, 200]
    assert np.array_equal(epochs_a[0], epochs_b[0]) and np.array_equal(epochs_a[1], epochs_b[1])
    assert not np.array_equal(epochs_a[0], epochs_a[1])
    assert np.array_equal(np.sort(epochs_a[0]), np.sort(epochs_a[1]))
    b.set_epoch(1)
    assert np.array_equal(np.concatenate([y.asnumpy() for _, y in b]), epochs_a[1])


def _link_all(src, dst):
    os.makedirs(dst, exist_ok=True)
    for name in data.FILES['train'] + data.FILES['test']:
        os.symlink(os.path.join(src, name), os.path.join(dst, name))


def test_search_order(tmp_path, monkeypatch, data_dir):
    home = tmp_path / 'mxhome'
    monkeypatch.setenv('MXNET_HOME', str(home))
    monkeypatch.setattr(data, 'SYSTEM_DIR', data_dir)
    assert data.data_dir_candidates() == [str(home / 'datasets' / 'fashion-mnist'), data_dir]
    assert gluon_mgpu.find_data_dir() == data_dir
    _link_all(data_dir, str(home / 'datasets' / 'fashion-mnist'))
    assert gluon_mgpu.find_data_dir() == str(home / 'datasets' / 'fashion-mnist')
    explicit = tmp_path / 'explicit'
    _link_all(data_dir, str(explicit))
    assert gluon_mgpu.find_data_dir(str(explicit)) == str(explicit)


def test_default_mxnet_home_is_dot_mxnet(monkeypatch):
    monkeypatch.delenv('MXNET_HOME', raising=False)
    assert data.data_dir_candidates()[0] == os.path.expanduser('~/.mxnet/datasets/fashion-mnist')


def test_missing_data_lists_places_searched_and_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv('MXNET_HOME', str(tmp_path / 'home'))
    monkeypatch.setattr(data, 'SYSTEM_DIR', str(tmp_path / 'system'))
    with pytest.raises(gluon_mgpu.DataNotFoundError) as e:
        gluon_mgpu.load_data_fashion_mnist(32)
    message = str(e.value)
    assert message.startswith('Fashion-MNIST not found: searched %s, %s for '
                              % (tmp_path / 'home' / 'datasets' / 'fashion-mnist',
                                 tmp_path / 'system'))
    assert 'apt-get install dataset-fashion-mnist' in message
    assert '\n' not in message


def test_explicit_data_dir_that_does_not_exist(tmp_path):
    with pytest.raises(gluon_mgpu.DataNotFoundError,
                       match=r'data dir .*nowhere does not exist; pass a folder that holds'):
        gluon_mgpu.load_data_fashion_mnist(32, data_dir=str(tmp_path / 'nowhere'))


def _broken_copy(data_dir, tmp_path, name, content):
    folder = tmp_path / 'broken'
    _link_all(data_dir, str(folder))
    os.remove(folder / name)
    (folder / name).write_bytes(content)
    return str(folder), str(folder / name)


def _gz(payload):
    return gzip.compress(payload)


@pytest.mark.parametrize('case,match', [
    ('not-gzip', r'is not a complete gzip file'),
    ('cut-gzip', r'is not a complete gzip file'),
    ('short-header', r'is truncated: 6 bytes, fewer than its 8-byte header'),
    ('truncated', r'is truncated: its header announces 10000 = 10000 values but it holds 9999'),
    ('magic', r'has magic number 0x00000803, expected 0x00000801'),
])
def test_broken_label_file_is_named(case, match, data_dir, tmp_path):
    name = 't10k-labels-idx1-ubyte.gz'
    with open(os.path.join(data_dir, name), 'rb') as f:
        good = f.read()
    raw = gzip.decompress(good)
    content = {'not-gzip': b'hello, not gzip',
               'cut-gzip': good[:len(good) // 2],
               'short-header': _gz(raw[:6]),
               'truncated': _gz(raw[:-1]),
               'magic': _gz(struct.pack('>I', 0x803) + raw[4:])}[case]
    folder, path = _broken_copy(data_dir, tmp_path, name, content)
    with pytest.raises(gluon_mgpu.DataError, match=match) as e:
        gluon_mgpu.load_data_fashion_mnist(32, data_dir=folder)
    assert str(e.value).startswith(path)


def test_image_label_count_mismatch_names_both_files(data_dir, tmp_path):
    name = 't10k-labels-idx1-ubyte.gz'
    with open(os.path.join(data_dir, name), 'rb') as f:
        raw = gzip.decompress(f.read())
    fewer = struct.pack('>II', 0x801, 9000) + raw[8:8 + 9000]
    folder, path = _broken_copy(data_dir, tmp_path, name, _gz(fewer))
    with pytest.raises(gluon_mgpu.DataError, match=r't10k-images-idx3-ubyte.gz holds 10000 '
                                                   r'images but .*t10k-labels-idx1-ubyte.gz '
                                                   r'holds 9000 labels'):
        gluon_mgpu.load_data_fashion_mnist(32, data_dir=folder)


@pytest.mark.parametrize('kwargs,match', [
    ({'train_limit': 60001}, r'train_limit=60001 is more than the 60000 training images; '
                             r'pass at most 60000'),
    ({'test_limit': 0}, r'test_limit must be a whole number >= 1, got 0'),
    ({'test_limit': 10001}, r'test_limit=10001 is more than the 10000 test images'),
])
def test_limits_are_checked(kwargs, match, data_dir):
    with pytest.raises(ValueError, match=match):
        gluon_mgpu.load_data_fashion_mnist(32, data_dir=data_dir, **kwargs)


def test_batch_size_is_checked():
    with pytest.raises(ValueError, match=r'batch_size must be a whole number >= 1, got 0'):
        data.ArrayBatches(np.zeros((2, 28, 28), np.uint8), np.zeros(2, np.uint8), 0)


def test_gluon_dataloader_path_gives_the_same_batches(data_dir):
    kwargs = dict(data_dir=data_dir, train_limit=70, test_limit=30, seed=4)
    fast = gluon_mgpu.load_data_fashion_mnist(32, **kwargs)
    book = gluon_mgpu.load_data_fashion_mnist(32, loader='gluon', **kwargs)
    assert isinstance(book[0], data.GluonBatches)
    for a, b in zip(fast, book):
        for _ in range(2):  # two epochs: two different shuffled orders
            pairs = list(zip(a, b))
            assert len(pairs) == len(a) == len(b)
            for (Xa, ya), (Xb, yb) in pairs:
                assert Xa.dtype == Xb.dtype == np.float32 and ya.dtype == yb.dtype == np.int32
                assert np.array_equal(Xa.asnumpy(), Xb.asnumpy())
                assert np.array_equal(ya.asnumpy(), yb.asnumpy())


def test_unknown_loader_is_rejected(data_dir):
    with pytest.raises(ValueError, match=r"loader must be one of array/gluon, got 'torch'"):
        gluon_mgpu.load_data_fashion_mnist(32, data_dir=data_dir, loader='torch')


def _shard_labels(batches):
    return [y.asnumpy().tolist() for _, y in batches]


def test_shards_are_disjoint_equal_and_match_a_split_over_devices():
    # Labels are the example indices, so every batch shows which examples it holds.
    n, batch, parts = 70, 16, 2
    images, labels = np.zeros((n, 28, 28), np.uint8), np.arange(n)
    whole = data.ArrayBatches(images, labels, batch, shuffle=True, seed=5)
    shards = [data.ArrayBatches(images, labels, batch, shuffle=True, seed=5, num_parts=parts,
                                part_index=r) for r in range(parts)]
    for epoch in range(2):
        global_batches = _shard_labels(whole)
        per_part = [_shard_labels(s) for s in shards]
        # 70 examples, global batch 16: 4 full batches; the 6 left over are skipped.
        assert [len(p) for p in per_part] == [4, 4] and [len(s) for s in shards] == [4, 4]
        assert [s.examples_per_epoch for s in shards] == [32, 32]
        assert whole.examples_per_epoch == 70
        assert all(len(b) == 8 for p in per_part for b in p)
        for g, (b0, b1) in enumerate(zip(*per_part)):
            assert b0 == global_batches[g][:8] and b1 == global_batches[g][8:]
        seen = [i for p in per_part for b in p for i in b]
        assert len(seen) == len(set(seen)) == 64
        assert sorted(seen) == sorted(whole.order(epoch)[:64].tolist())
        assert shards[1].order(epoch).tolist() == [i for b in per_part[1] for i in b]
    assert per_part != [_shard_labels(s) for s in shards]  # the third epoch: another order


def test_shards_are_reproducible_and_use_the_gluon_path_alike(data_dir):
    def shard(loader, seed):
        train_iter, _ = gluon_mgpu.load_data_fashion_mnist(
            12, data_dir=data_dir, train_limit=40, test_limit=4, seed=seed, loader=loader)
        train_iter.set_part(3, 2)
        return [(X.asnumpy(), y.asnumpy()) for X, y in train_iter]

    a, b, book = shard('array', 1), shard('array', 1), shard('gluon', 1)
    assert len(a) == 3 and all(X.shape == (4, 1, 28, 28) for X, _ in a)
    for (Xa, ya), (Xb, yb), (Xg, yg) in zip(a, b, book):
        assert np.array_equal(Xa, Xb) and np.array_equal(ya, yb)
        assert np.array_equal(Xa, Xg) and np.array_equal(ya, yg)
    other = shard('array', 2)
    assert any(not np.array_equal(ya, yo) for (_, ya), (_, yo) in zip(a, other))


@pytest.mark.parametrize('n,batch,parts,index,match', [
    (40, 15, 2, 0, r'batch size 15 is not a multiple of the 2 workers, so their shares would '
                   r'differ; use a batch size of 14 or 16'),
    (10, 16, 2, 0, r'10 examples are fewer than one global batch of 16'),
    (40, 16, 2, 2, r'part_index must be in 0..1, got 2'),
    (40, 16, 0, 0, r'num_parts must be a whole number >= 1, got 0'),
])
def test_bad_shards_are_refused(n, batch, parts, index, match):
    batches = data.ArrayBatches(np.zeros((n, 28, 28), np.uint8), np.zeros(n), batch)
    with pytest.raises(ValueError, match=match):
        batches.set_part(parts, index)
