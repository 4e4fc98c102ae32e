"""Refresh the tables made from the book table's records alone, without training and without
re-running the chapter's cells: the record blocks of docs/book-comparison.md (the accuracy table,
the old step beside the book's, the BatchNorm diagnosis, bfloat16) and the accuracy table of both
notebooks. tests/test_compare.py and tests/test_notebooks.py check both against the records.

    .venv/bin/python benchmarks/book_tables.py          # after new lines in docs/*-table.jsonl

`python -m gluon_mgpu.compare --output docs/book-comparison.md` refreshes the page's other
blocks too (it re-runs the chapter's cells and the step: a few minutes).
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import gluon_mgpu  # noqa: E402,F401  (before MXNet: the thread settings)
import nbformat  # noqa: E402
from gluon_mgpu import training  # noqa: E402
from gluon_mgpu.commands import booktable, compare  # noqa: E402
from gluon_mgpu.runtime.files import atomic_path  # noqa: E402

PAGE = os.path.join(ROOT, 'docs', 'book-comparison.md')
NOTEBOOKS = {'en': os.path.join(ROOT, 'notebooks', 'multiple-gpus-gluon.ipynb'),
             'zh': os.path.join(ROOT, 'notebooks', 'multiple-gpus-gluon.zh.ipynb')}
TAG = 'book-table'  # the notebooks' cell that holds the table


def table_rows(text):
    """The indices of the lines of ``text`` that are a Markdown table's body rows."""
    lines = text.split('\n')
    rows = [i for i, line in enumerate(lines) if line.startswith('|')]
    return rows[2:]  # after the header and the rule


def fill_notebook_table(source, cells):
    """``source`` (a Markdown cell) with its table's cells after the first column replaced."""
    lines = source.split('\n')
    rows = table_rows(source)
    if len(rows) != len(cells):
        raise SystemExit('the notebook\'s table has %d rows, the records give %d: edit the '
                         'cell\'s rows first' % (len(rows), len(cells)))
    for i, values in zip(rows, cells):
        title = lines[i].strip('|').split('|')[0].strip()
        lines[i] = '| %s | %s |' % (title, ' | '.join(values))
    return '\n'.join(lines)


def main():
    records = booktable.read_records(booktable.DEFAULT_RECORD)
    old = booktable.read_records(booktable.OLD_STEP_RECORD, step=training.OLD_STEP)
    bf16 = booktable.read_records(booktable.DEFAULT_BF16_RECORD)
    report = compare.record_report(records, old, bf16)
    blocks = compare.page_blocks(dict(report, rows=[], cells={'devices': ['', ''], 'outputs':
                                                             [[0], [0]], 'weights': [[0], [0]]},
                                      command='', date='', mxnet_version='', record=''))
    with open(PAGE, encoding='utf-8') as f:
        page = compare.update_page(f.read(), {k: blocks[k] for k in
                                              ('accuracy', 'old-step', 'diagnosis', 'bf16')})
    with atomic_path(PAGE) as tmp, open(tmp, 'w', encoding='utf-8') as f:
        f.write(page)
    for lang, path in NOTEBOOKS.items():
        nb = nbformat.read(path, as_version=4)
        [cell] = [c for c in nb.cells if TAG in c.metadata.get('tags', [])]
        cell.source = fill_notebook_table(cell.source,
                                          compare.notebook_table(report['accuracy'], lang))
        with atomic_path(path) as tmp:
            nbformat.write(nb, tmp)
    print('refreshed %s and %s from %d record lines'
          % (os.path.relpath(PAGE, ROOT), ', '.join(os.path.relpath(p, ROOT)
                                                   for p in NOTEBOOKS.values()), len(records)))


if __name__ == '__main__':
    main()
