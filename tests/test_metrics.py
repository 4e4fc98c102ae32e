import json
import math
import os
import re

import jsonschema  # installed with nbformat (requirements.txt)
import mxnet as mx
import pytest

import gluon_mgpu
from gluon_mgpu.handlers import metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _record(epoch, seconds, images, loss, train_acc, test_acc):
    return {'epoch': epoch, 'seconds': seconds, 'images_per_sec': images / seconds,
            'train_loss': loss, 'train_acc': train_acc, 'test_acc': test_acc}


HISTORY = [_record(1, 20.0, 60000, 0.61, 0.78, 0.86), _record(2, 4.6, 60000, 0.33, 0.88, 0.91)]
ARGUMENTS = {'num_gpus': 2, 'batch_size': 512, 'lr': 0.2, 'epochs': 2, 'device': 'auto',
             'data_dir': None, 'train_limit': None, 'test_limit': None, 'seed': 0,
             'hybridize': True, 'metrics_json': 'run.json'}


def _errors(doc):
    return [e.message for e in jsonschema.Draft202012Validator(metrics.SCHEMA).iter_errors(doc)]


def test_the_documented_schema_is_the_one_in_code():
    jsonschema.Draft202012Validator.check_schema(metrics.SCHEMA)
    with open(os.path.join(ROOT, 'docs', 'metrics-schema.md')) as f:
        assert f.read() == metrics.schema_page(), (
            'docs/metrics-schema.md is stale: run python -m gluon_mgpu.handlers.metrics > '
            'docs/metrics-schema.md')
    table = metrics.schema_page()
    for field in metrics.EPOCH_FIELDS:
        assert '| `history[].%s` |' % field in table


def test_summary_line_is_the_newer_editions_form():
    summary = metrics.summarize(HISTORY, [mx.gpu(0), mx.gpu(1)])
    assert summary['line'] == 'test acc: 0.91, 12.3 sec/epoch on [gpu(0), gpu(1)]'
    assert summary['sec_per_epoch'] == pytest.approx(12.3)
    assert summary['images_per_sec'] == pytest.approx(120000 / 24.6)
    assert (summary['test_acc'], summary['train_loss'], summary['epochs']) == (0.91, 0.33, 2)
    assert metrics.format_summary(HISTORY, [mx.cpu(0)]) == \
        'test acc: 0.91, 12.3 sec/epoch on [cpu(0)]'
    with pytest.raises(ValueError, match='history is empty; train at least one epoch'):
        metrics.summarize([], [mx.cpu(0)])


def test_metrics_file_is_rewritten_after_every_epoch(tmp_path):
    path = tmp_path / 'run.json'
    f = metrics.MetricsFile(str(path), ARGUMENTS, [mx.cpu(0), mx.cpu(1)])
    doc = json.loads(path.read_text())
    assert _errors(doc) == []
    assert (doc['status'], doc['history'], doc['summary']) == ('running', [], None)
    assert doc['arguments'] == ARGUMENTS and doc['devices'] == ['cpu(0)', 'cpu(1)']
    assert doc['versions']['mxnet'] == mx.__version__
    # conftest imports gluon_mgpu first; OMP_NUM_THREADS may come from the caller (CI, a user).
    assert doc['threads'] == gluon_mgpu.thread_settings()
    assert doc['threads']['source'] in ('gluon_mgpu', 'user')
    assert doc['threads']['omp_num_threads'] == int(os.environ['OMP_NUM_THREADS'])
    for n, record in enumerate(HISTORY, 1):
        f.add_epoch(dict(record, extra_key='not written'))
        doc = json.loads(path.read_text())
        assert _errors(doc) == []
        assert doc['history'] == HISTORY[:n] and doc['status'] == 'running'
    f.finish(metrics.summarize(HISTORY, [mx.cpu(0), mx.cpu(1)]))
    doc = json.loads(path.read_text())
    assert _errors(doc) == []
    assert doc['status'] == 'finished'
    assert doc['summary']['line'] == 'test acc: 0.91, 12.3 sec/epoch on [cpu(0), cpu(1)]'
    assert os.listdir(tmp_path) == ['run.json']  # no temporary file left behind


def test_a_diverged_loss_is_written_as_null(tmp_path):
    path = tmp_path / 'run.json'
    f = metrics.MetricsFile(str(path), ARGUMENTS, [mx.cpu(0)])
    f.add_epoch(dict(HISTORY[0], train_loss=math.nan))
    doc = json.loads(path.read_text())
    assert doc['history'][0]['train_loss'] is None
    assert _errors(doc) == []


@pytest.mark.parametrize('change,expected', [
    (lambda d: d.pop('history'), "'history' is a required property"),
    (lambda d: d['history'][0].update(test_acc=1.5), '1.5 is greater than the maximum of 1'),
    (lambda d: d['history'][0].pop('images_per_sec'), "'images_per_sec' is a required property"),
    (lambda d: d.update(status='done'), "'done' is not one of \\['running', 'finished'\\]"),
    (lambda d: d['devices'].append('tpu(0)'), "'tpu\\(0\\)' does not match"),
    (lambda d: d['arguments'].pop('num_gpus'), "'num_gpus' is a required property"),
])
def test_the_schema_rejects_what_it_should(tmp_path, change, expected):
    path = tmp_path / 'run.json'
    f = metrics.MetricsFile(str(path), ARGUMENTS, [mx.cpu(0)])
    f.add_epoch(HISTORY[0])
    doc = json.loads(path.read_text())
    change(doc)
    errors = _errors(doc)
    assert len(errors) == 1, errors
    assert re.search(expected, errors[0]), errors


def test_atomic_write_keeps_the_old_file_on_error(tmp_path):
    path = tmp_path / 'run.json'
    metrics.write_json_atomic(str(path), {'a': 1})
    with pytest.raises(ValueError):
        metrics.write_json_atomic(str(path), {'a': math.inf})  # not valid JSON
    assert json.loads(path.read_text()) == {'a': 1}
    assert os.listdir(tmp_path) == ['run.json']
