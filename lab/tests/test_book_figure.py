"""The book's accuracy table as a picture (lab/book_figure.py), which
``book_table.py --tables`` draws from the records: the committed one is the records' now."""
import io
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, 'lab'))
import book_figure  # noqa: E402
import book_records  # noqa: E402



def _data_now():
    records = book_records.read_records(book_records.DEFAULT_RECORD)
    gpu_runs = book_records.read_gpu_runs()
    return book_figure.figure_data(book_records.accuracy_cells(records, gpu_runs), gpu_runs,
                                   book_records.machine_legend(records))


def test_the_committed_figure_plots_the_records_and_gpu_runs_now():
    data = _data_now()
    # JSON keeps every float as it is: the committed figure's values are the records', exactly.
    assert book_figure.read_data() == json.loads(json.dumps(data)), (
        'docs/figures/book-accuracy.png is stale: run lab/book_table.py --tables')
    # What a reader sees: the book's printed values, every GPU run, every seed of ours.
    [one, two] = data['panels']
    assert [e['book'] for e in one['epochs']] == [0.86, 0.91, 0.91, 0.93]
    assert [e['book'] for e in two['epochs']] == [0.77, 0.86, 0.88, 0.89]
    assert sum(len(e['same']) + len(e['later']) for p in data['panels']
               for e in p['epochs'] if e['epoch'] == 1) == 9 * 2 + 107 * 2
    assert data['machines'][:3] == [
        ['A', 'ours, machine A: AMD EPYC (kernels, threads not recorded)'],
        ['B', 'ours, machine B: Intel Xeon Processor (kernels, threads not recorded)'],
        ['C', 'ours, machine C: AMD EPYC, AVX-512 kernels, 2 threads']]


def test_the_committed_figure_is_its_drawing_byte_for_byte():
    drawn = book_figure.draw(_data_now())
    with open(book_figure.FIGURE, 'rb') as f:
        committed = f.read()
    text = book_figure.read_png_text(book_figure.FIGURE)
    if text[book_figure.DRAWN_WITH_KEY] == book_figure.drawn_with():
        assert drawn == committed
    else:  # another matplotlib or Pillow draws other bytes: what they plot must be the same
        assert book_figure.read_data(io.BytesIO(drawn)) == book_figure.read_data()


def test_a_drawing_is_the_same_bytes_every_time_with_no_date_or_software_in_it():
    data = _data_now()
    first = book_figure.draw(data)
    assert book_figure.draw(data) == first
    assert b'tIME' not in first and b'Software' not in first
    assert sorted(book_figure.read_png_text(io.BytesIO(first))) == sorted(
        [book_figure.DATA_KEY, book_figure.DRAWN_WITH_KEY])
    # A changed value is another picture, whose data says which.
    data['panels'][1]['epochs'][0]['ours'][0][1] = 0.5
    changed = book_figure.draw(data)
    assert changed != first
    assert book_figure.read_data(io.BytesIO(changed))['panels'][1]['epochs'][0]['ours'][0] == [
        0, 0.5, 'A']
