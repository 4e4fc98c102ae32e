import os
import struct

import numpy as np
import pytest
from matplotlib.image import imread

from gluon_mgpu.handlers import plotting

HISTORY = [{'epoch': e, 'seconds': 10.0, 'images_per_sec': 100.0, 'train_loss': loss,
            'train_acc': acc - 0.05, 'test_acc': acc}
           for e, loss, acc in [(1, 0.9, 0.70), (2, 0.5, 0.82), (3, 0.4, 0.86)]]


def png_size(path):
    """Width and height from a PNG's IHDR chunk, after checking the signature."""
    with open(path, 'rb') as f:
        head = f.read(24)
    assert head[:8] == b'\x89PNG\r\n\x1a\n', 'not a PNG: %r' % head[:8]
    assert head[12:16] == b'IHDR'
    return struct.unpack('>II', head[16:24])


def test_history_plot_is_a_png_of_the_expected_size_with_curves(tmp_path):
    path = str(tmp_path / 'curves.png')
    assert plotting.plot_history(HISTORY, path, title='[cpu(0), cpu(1)]', num_epochs=4) == [path]
    assert png_size(path) == (600, 400)
    pixels = imread(path)
    assert pixels.shape[:2] == (400, 600)
    rgb = pixels[:, :, :3]
    # Blue (C0, test acc) and orange (C1, train loss) lines are drawn: count their pixels.
    c0, c1 = np.array([0.12, 0.47, 0.71]), np.array([1.0, 0.5, 0.05])
    assert (np.abs(rgb - c0).max(axis=2) < 0.05).sum() > 300
    assert (np.abs(rgb - c1).max(axis=2) < 0.05).sum() > 300
    assert os.listdir(tmp_path) == ['curves.png']


def test_an_svg_name_writes_the_svg_and_a_png_beside_it(tmp_path):
    path = str(tmp_path / 'curves.svg')
    written = plotting.plot_history(HISTORY[:1], path)
    assert written == [path, str(tmp_path / 'curves.png')]
    with open(path) as f:
        svg = f.read()
    assert svg.startswith('<?xml') and '<svg' in svg and 'test acc' in svg
    assert png_size(written[1]) == (600, 400)


def test_bad_plot_requests_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"must end in \.png or \.svg; for example curves\.png"):
        plotting.plot_history(HISTORY, str(tmp_path / 'curves.pdf'))
    with pytest.raises(ValueError, match='history is empty; plot after at least one epoch'):
        plotting.plot_history([], str(tmp_path / 'curves.png'))
    assert os.listdir(tmp_path) == []


def test_sweep_plot(tmp_path):
    rows = [{'num_devices': n, 'history': HISTORY, 'images_per_sec': 100.0 * n ** 0.5}
            for n in (1, 2, 4)]
    path = str(tmp_path / 'sweep.png')
    assert plotting.plot_sweep(rows, path, title='sweep') == [path]
    assert png_size(path) == (1000, 400)
