import io
import types

import pytest
from mxnet import nd

from gluon_mgpu.handlers import progress


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


RECORD = {'epoch': 1, 'seconds': 2.04, 'test_acc': 0.5}


def _drive(p, steps=4, batch=4, monkeypatch=None):
    """Send one epoch's events; return how often the running loss was read."""
    calls = []
    read = p._running_loss

    def running_loss():
        calls.append(1)
        return read()

    p._running_loss = running_loss
    run = types.SimpleNamespace(epoch=1, record=RECORD)
    p.epoch_begin(run)
    for step in range(1, steps + 1):
        # Two devices, half the batch each, every example's loss 2.25.
        loss = [nd.full((batch // 2,), 2.25), nd.full((batch // 2,), 2.25)]
        p.batch_end(run, batch=None, pred=None, label=None, loss=loss)
    p.epoch_end(run)
    return calls


def test_mode_follows_the_stream():
    assert progress.choose_mode(stream=FakeTerminal()) == 'bar'
    assert progress.choose_mode(stream=io.StringIO()) == 'lines'
    assert progress.choose_mode(quiet=True, stream=FakeTerminal()) == 'quiet'
    with pytest.raises(ValueError, match="mode must be one of bar/lines/quiet, got 'fancy'"):
        progress.Progress(1, mode='fancy')


def test_lines_mode_writes_only_the_books_line_and_never_reads_the_loss():
    out = io.StringIO()
    calls = _drive(progress.Progress(1, 16, stream=out))
    assert out.getvalue() == 'epoch 1, training time: 2.0 sec, test_acc 0.50\n'
    assert calls == []  # reading the loss would make the devices wait


def test_quiet_mode_writes_nothing():
    out = FakeTerminal()
    assert _drive(progress.Progress(1, 16, mode='quiet', stream=out)) == []
    assert out.getvalue() == ''


def test_bar_mode_shows_images_per_second_and_the_running_loss():
    out = FakeTerminal()
    calls = _drive(progress.Progress(3, 16, stream=out, label='2 devices, '))
    text = out.getvalue()
    assert '\r2 devices, epoch 1/3:' in text
    assert '4/16' in text and 'img/s' in text and 'loss=2.2500' in text
    # The bar is cleared, then the book's line follows on its own line.
    assert text.endswith('\repoch 1, training time: 2.0 sec, test_acc 0.50\n')
    assert 1 <= len(calls) < 4  # read at the first step, then at most every 0.5 s
