"""Fashion-MNIST from the four local IDX ``.gz`` files, and batching over devices; nothing here
downloads. docs/testing.md ("Data") says where the files are looked for and why.
"""
import gzip
import math
import os
import struct
import zlib

import numpy as np
from mxnet import nd

from .runtime.checks import check_whole
from .runtime.files import InputError, input_problem, open_input

__all__ = ['FILES', 'DataError', 'DataNotFoundError', 'data_dir_candidates', 'find_data_dir',
           'read_idx', 'load_fashion_mnist_arrays', 'to_tensor', 'ArrayBatches', 'GluonBatches',
           'load_data_fashion_mnist', 'TEXT_LABELS', 'get_fashion_mnist_labels']

FILES = {
    'train': ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz'),
    'test': ('t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz'),
}
SYSTEM_DIR = '/usr/share/datasets/fashion-mnist'
IMAGE_SHAPE = (28, 28)
SIZES = {'train': 60000, 'test': 10000}  # examples in each split of the release
TEXT_LABELS = ('t-shirt', 'trouser', 'pullover', 'dress', 'coat',
               'sandal', 'shirt', 'sneaker', 'bag', 'ankle boot')
HOW_TO_GET = ('on Debian/Ubuntu run `apt-get install dataset-fashion-mnist` (it installs them in '
              '%s), or copy the four files from github.com/zalandoresearch/fashion-mnist into '
              'one of these folders, or pass data_dir / --data-dir' % SYSTEM_DIR)

# IDX magic numbers: two zero bytes, the type code 0x08 (unsigned byte), the number of dims.
_MAGIC = {1: 0x00000801, 3: 0x00000803}


class DataError(ValueError):
    """A data file exists but cannot be used (not a regular file, truncated, not IDX, ...)."""


class DataNotFoundError(FileNotFoundError):
    """None of the searched folders holds the Fashion-MNIST files."""


def data_dir_candidates(data_dir=None):
    """The folders searched for the data set, in order: ``data_dir`` alone when given, else
    ``$MXNET_HOME/datasets/fashion-mnist`` (default ``~/.mxnet``), then Debian's folder."""
    if data_dir is not None:
        return [os.path.expanduser(str(data_dir))]
    mxnet_home = os.environ.get('MXNET_HOME') or os.path.join('~', '.mxnet')
    return [os.path.expanduser(os.path.join(mxnet_home, 'datasets', 'fashion-mnist')),
            SYSTEM_DIR]


def find_data_dir(data_dir=None):
    """Return the first candidate folder that holds all four files.

    Raises
    ------
    DataNotFoundError
        Listing every folder searched and how to get the files.
    DataError
        Naming a file of a folder that holds all four names but is not a usable regular file.
    """
    names = FILES['train'] + FILES['test']
    candidates = data_dir_candidates(data_dir)
    broken = None
    for folder in candidates:
        paths = [os.path.join(folder, n) for n in names]
        problems = [input_problem(p) for p in paths]
        if not any(problems):
            return folder
        if broken is None and all(os.path.lexists(p) for p in paths):
            broken = next((p, problem) for p, problem in zip(paths, problems) if problem)
        elif broken is None and os.path.isdir(folder) and all(  # a folder we cannot enter
                (problem or '').startswith('cannot be read') for problem in problems):
            broken = folder, problems[0] + ', so its files cannot be reached'
    if broken is not None:
        raise DataError('%s %s; %s' % (*broken, _input_fix(*broken)))
    if data_dir is not None and not os.path.isdir(candidates[0]):
        what = input_problem(candidates[0]) or 'is a file, not a regular file'
        if what.startswith('is ') and what.endswith(', not a regular file'):
            what = what[:-len(', not a regular file')] + ', not a folder'
        raise DataNotFoundError('data dir %s %s; pass a folder that holds %s, or leave it out '
                                'to search the default places'
                                % (candidates[0], what, ', '.join(names)))
    raise DataNotFoundError('Fashion-MNIST not found: searched %s for %s; %s'
                            % (', '.join(candidates), ', '.join(names), HOW_TO_GET))


def _input_fix(path, problem):
    if problem.startswith('cannot be read'):
        return 'make it readable for this user, or copy it to a folder of your own'
    return 'replace it with the file itself (a copy of Fashion-MNIST\'s %s)' \
        % os.path.basename(path)


def read_idx(path, ndim, item_shape=None, max_items=None):
    """Read one gzipped IDX file of unsigned bytes into a numpy array.

    Parameters
    ----------
    path : str
        A ``*-idx1-ubyte.gz`` (labels, ``ndim=1``) or ``*-idx3-ubyte.gz`` (images, ``ndim=3``).
    ndim : int
    item_shape : tuple of int, optional
        The shape every item must have, checked from the header before the values are read.
    max_items : int, optional
        The most items the file may announce, checked from the header before the values are
        read (a small file of compressed zeros could otherwise expand into all of memory).

    Raises
    ------
    DataError
        Naming the file and what is wrong with it.
    """
    try:
        raw_file = open_input(path)
    except InputError as e:
        raise DataError('%s %s; %s' % (path, e.reason, _input_fix(path, e.reason))) from None
    header = 4 + 4 * ndim
    try:
        with raw_file, gzip.GzipFile(fileobj=raw_file, mode='rb') as f:
            head = f.read(header)
            if len(head) < header:
                raise DataError('%s is truncated: %d bytes, fewer than its %d-byte header; '
                                'replace it with a fresh copy' % (path, len(head), header))
            magic, *shape = struct.unpack('>%dI' % (ndim + 1), head)
            if magic != _MAGIC[ndim]:
                raise DataError('%s has magic number 0x%08x, expected 0x%08x for a '
                                '%d-dimensional IDX file of unsigned bytes; is it the right '
                                'file?' % (path, magic, _MAGIC[ndim], ndim))
            if item_shape is not None and tuple(shape[1:]) != tuple(item_shape):
                raise DataError('%s holds items of %s values, but Fashion-MNIST\'s are %s; is '
                                'it the right file?' % (path, 'x'.join(map(str, shape[1:])),
                                                        'x'.join(map(str, item_shape))))
            if max_items is not None and shape[0] > max_items:
                raise DataError('%s announces %d items in its header, more than the %d a '
                                'Fashion-MNIST file holds; is it the right file?'
                                % (path, shape[0], max_items))
            expected = math.prod(shape)  # Python ints: no overflow, whatever the header says
            raw = b''
            while len(raw) <= expected:  # in blocks: memory follows the file, not its header
                block = f.read(1 << 24)
                if not block:
                    break
                raw += block
    except (OSError, EOFError, zlib.error) as e:
        raise DataError('%s is not a complete gzip file (%s); replace it with a fresh copy'
                        % (path, e)) from None
    if len(raw) != expected:
        announced = '%s = %d values' % ('x'.join(map(str, shape)), expected)
        if len(raw) < expected:
            raise DataError('%s is truncated: its header announces %s but it holds %d; '
                            'replace it with a fresh copy' % (path, announced, len(raw)))
        raise DataError('%s holds more values than its header announces (%s); replace it '
                        'with a fresh copy' % (path, announced))
    return np.frombuffer(raw, dtype=np.uint8).reshape(shape)


def load_fashion_mnist_arrays(split, data_dir=None):
    """Return ``(images, labels)`` of one split as ``uint8`` arrays of shape (N, 28, 28) and (N,).

    ``split`` is ``'train'`` or ``'test'``; ``data_dir`` as in ``find_data_dir``.
    """
    if split not in FILES:
        raise ValueError("split must be 'train' or 'test', got %r" % (split,))
    folder = find_data_dir(data_dir)
    image_file, label_file = (os.path.join(folder, n) for n in FILES[split])
    images = read_idx(image_file, 3, IMAGE_SHAPE, SIZES[split])
    if images.shape[0] == 0:
        raise DataError('%s holds 0 images, so there is nothing to %s on; replace it with a '
                        'fresh copy' % (image_file, split))
    labels = read_idx(label_file, 1, (), SIZES[split])
    if images.shape[0] != labels.shape[0]:
        raise DataError('%s holds %d images but %s holds %d labels; the two files must come '
                        'from the same release' % (image_file, images.shape[0], label_file,
                                                   labels.shape[0]))
    wrong = np.flatnonzero(labels >= len(TEXT_LABELS))
    if len(wrong):
        raise DataError('%s holds label %d at index %d (%d labels outside 0..%d); Fashion-MNIST '
                        'has %d classes, 0 to %d: replace it with a fresh copy'
                        % (label_file, labels[wrong[0]], wrong[0], len(wrong),
                           len(TEXT_LABELS) - 1, len(TEXT_LABELS), len(TEXT_LABELS) - 1))
    return images, labels


def to_tensor(images):
    """Convert ``uint8`` images (N, H, W) to float32 (N, 1, H, W) in [0, 1], exactly as
    ``gluon.data.vision.transforms.ToTensor`` does per image."""
    return (images.astype(np.float32) / np.float32(255))[:, None, :, :]


class ArrayBatches:
    """Mini-batches ``(X, y)`` of NDArrays from in-memory arrays, equal to the book's
    ``DataLoader`` with ``ToTensor`` (``GluonBatches``) and faster (docs/speed.md).

    Parameters
    ----------
    images : numpy.ndarray
        ``uint8`` images of shape (N, H, W).
    labels : numpy.ndarray
        Class indices, shape (N,); batches carry them as ``int32``.
    batch_size : int
        Examples per batch; the last holds the rest (see ``set_min_batch`` and ``set_part``).
    shuffle : bool, default False
        Draw a new order for each pass (each ``for`` loop is one epoch).
    seed : int, optional
        Epoch ``e``'s order is drawn from ``(seed, e)``: the same on every run (``set_epoch``).
    num_parts, part_index : int, optional
        See ``set_part``.
    """

    def __init__(self, images, labels, batch_size, shuffle=False, seed=None, num_parts=None,
                 part_index=0):
        check_whole('batch_size', batch_size, 'pass a positive count')
        if len(images) != len(labels):
            raise ValueError('%d images but %d labels' % (len(images), len(labels)))
        self.images, self.labels = images, labels
        self.batch_size, self.shuffle = int(batch_size), shuffle
        self.seed = int(np.random.randint(2 ** 31)) if seed is None else int(seed)
        self.epoch = 0
        self.num_parts = self.part_index = None
        self.min_batch = 1
        self._X = self._y = None
        if num_parts is not None:
            self.set_part(num_parts, part_index)

    @property
    def num_examples(self):
        return len(self.labels)

    @property
    def examples_per_epoch(self):
        """How many examples one pass yields."""
        if self.num_parts is None:
            return self.num_examples
        return len(self) * (self.batch_size // self.num_parts)

    def __len__(self):
        if self.num_parts is not None:
            return self.num_examples // self.batch_size
        return len(self._bounds(self.num_examples, self.batch_size))

    def set_min_batch(self, min_batch):
        """Make a last batch of fewer than ``min_batch`` examples join the batch before it
        (``train()`` passes the device count: every device needs an example)."""
        check_whole('min_batch', min_batch, 'pass a positive count')
        self.min_batch = int(min_batch)

    def _bounds(self, n, batch_size):
        """``(start, stop)`` of every batch of ``n`` examples in order."""
        bounds = [(start, min(start + batch_size, n)) for start in range(0, n, batch_size)]
        if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] < self.min_batch:
            bounds[-2:] = [(bounds[-2][0], n)]
        return bounds

    def set_part(self, num_parts, part_index):
        """Yield only shard ``part_index`` of ``num_parts``: one worker's share of a dist job.

        Part ``r`` gets the ``r``-th equal slice of every full global batch of the epoch; the
        rest is skipped (docs/distributed.md). ``ValueError`` when the shares cannot be equal.
        """
        check_whole('num_parts', num_parts, 'pass a positive count')
        if not 0 <= part_index < num_parts:
            raise ValueError('part_index must be in 0..%d, got %r' % (num_parts - 1, part_index))
        if self.batch_size % num_parts:
            raise ValueError('batch size %d is not a multiple of the %d workers, so their shares '
                             'would differ; use a batch size of %d or %d'
                             % (self.batch_size, num_parts,
                                max(num_parts, self.batch_size // num_parts * num_parts),
                                -(-self.batch_size // num_parts) * num_parts))
        if self.num_examples < self.batch_size:
            raise ValueError('%d examples are fewer than one global batch of %d; use more '
                             'examples or a smaller batch size'
                             % (self.num_examples, self.batch_size))
        self.num_parts, self.part_index = int(num_parts), int(part_index)

    def set_epoch(self, epoch):
        """Make the next pass use the order of epoch ``epoch`` (counted from 0)."""
        self.epoch = int(epoch)

    def order(self, epoch):
        """Return the example order of epoch ``epoch`` (this part's only, after ``set_part``)."""
        n = self.num_examples
        idx = np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else \
            np.arange(n)
        if self.num_parts is None:
            return idx
        full = n // self.batch_size * self.batch_size
        share = self.batch_size // self.num_parts
        return idx[:full].reshape(-1, self.num_parts, share)[:, self.part_index, :].ravel()

    def _batches(self, idx, batch_size):
        if self._X is None:
            self._X = nd.array(to_tensor(self.images), dtype='float32')
            self._y = nd.array(self.labels, dtype='int32')
        in_order = not self.shuffle and self.num_parts is None
        for start, stop in self._bounds(len(idx), batch_size):
            if in_order:
                yield self._X[start:stop], self._y[start:stop]
            else:
                take = nd.array(idx[start:stop], dtype='int32')
                yield nd.take(self._X, take), nd.take(self._y, take)

    def __iter__(self):
        idx = self.order(self.epoch)
        self.epoch += 1
        share = self.batch_size if self.num_parts is None else self.batch_size // self.num_parts
        return self._batches(idx, share)


class GluonBatches(ArrayBatches):
    """The book's data path: a Gluon ``DataLoader`` applying ``ToTensor`` image by image; the
    same batches as ``ArrayBatches``, slower."""

    def _batches(self, idx, batch_size):
        from mxnet.gluon import data as gdata
        dataset = gdata.ArrayDataset(nd.array(self.images[:, :, :, None], dtype='uint8'),
                                     self.labels.astype(np.int32))
        dataset = dataset.transform_first(gdata.vision.transforms.ToTensor())
        batches = [idx[a:b].tolist() for a, b in self._bounds(len(idx), batch_size)]
        for X, y in gdata.DataLoader(dataset, batch_sampler=batches):
            yield X, y.astype('int32')


LOADERS = {'array': ArrayBatches, 'gluon': GluonBatches}


def _check_limit(name, value, size, what):
    if value is None:
        return size
    check_whole(name, value, 'pass a positive count or None for all %d %s' % (size, what))
    if value > size:
        raise ValueError('%s=%d is more than the %d %s; pass at most %d (or None for all)'
                         % (name, value, size, what, size))
    return int(value)


def load_data_fashion_mnist(batch_size, data_dir=None, train_limit=None, test_limit=None,
                            shuffle=True, seed=None, loader='array'):
    """Return ``(train_iter, test_iter)`` over Fashion-MNIST read from local files.

    Batches are ``(X, y)``: ``X`` float32 (batch, 1, 28, 28) in [0, 1], as the book's
    ``ToTensor`` gives, and ``y`` int32 class indices.

    Parameters
    ----------
    batch_size : int
    data_dir : str, optional
        Folder of the four IDX ``.gz`` files; searched for when omitted (``data_dir_candidates``).
    train_limit, test_limit : int, optional
        Use only the first N training / test examples.
    shuffle : bool, default True
        Shuffle the training set every epoch (never the test set), from ``seed`` if given.
    seed : int, optional
    loader : {'array', 'gluon'}, default 'array'
        ``ArrayBatches``, or ``GluonBatches`` (the book's ``DataLoader``; slower).
    """
    if loader not in LOADERS:
        raise ValueError("loader must be one of %s, got %r; use 'array' (fast) or 'gluon' (the "
                         "book's DataLoader)" % ('/'.join(LOADERS), loader))
    train_x, train_y = load_fashion_mnist_arrays('train', data_dir)
    test_x, test_y = load_fashion_mnist_arrays('test', data_dir)
    n_train = _check_limit('train_limit', train_limit, len(train_y), 'training images')
    n_test = _check_limit('test_limit', test_limit, len(test_y), 'test images')
    batches = LOADERS[loader]
    train_iter = batches(train_x[:n_train], train_y[:n_train], batch_size, shuffle=shuffle,
                         seed=seed)
    test_iter = batches(test_x[:n_test], test_y[:n_test], batch_size)
    return train_iter, test_iter


def get_fashion_mnist_labels(labels):
    """Return the text names of numeric Fashion-MNIST labels; ``ValueError`` for one that is
    none of the 10 (-1 would have named the last)."""
    found = [int(i) for i in labels]
    wrong = [i for i in found if not 0 <= i < len(TEXT_LABELS)]
    if wrong:
        raise ValueError('labels holds %d, not a Fashion-MNIST label (0 to 9); pass the labels '
                         'the data set gives, such as y.asnumpy()' % wrong[0])
    return [TEXT_LABELS[i] for i in found]
