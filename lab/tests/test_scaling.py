"""lab/scaling.py's arithmetic and report, from fixed records (nothing is measured)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # lab/
import scaling  # noqa: E402



def _device_run(count, value, phases, others=0.01):
    """A record of the devices table: ``phases`` seconds per phase, the same in its 2 steps."""
    return {'part': 'devices', 'count': count, 'value': value, 'cpu_per_wall': 1.75,
            'others_cores': others, 'disturbed': others > 0.2,
            'phases': {p: [t, t] for p, t in zip(scaling.DEVICE_PHASES, phases)}}


def _job(count, value, push_pull):
    workers = [{'rank': r, 'value': value + r,
                'phases': {'forward+backward': [0.5, 0.25], 'push/pull': push_pull[r]}}
               for r in reversed(range(count))]
    return scaling.job_record({'wall': 8.0, 'cpu': 12.0, 'cpu_per_wall': 1.5,
                               'others_cores': 0.0625, 'disturbed': False}, workers)


RECORDS = [_device_run(1, 50.0, (0.0, 0.0, 4.0, 0.0, 0.125)),
           _device_run(1, 100.0, (0.0, 0.0, 3.0, 0.0, 0.125)),
           _device_run(2, 64.0, (0.0, 0.0005, 3.5, 0.0625, 0.25)),
           _device_run(2, 8.0, (1.0, 1.0, 9.0, 1.0, 1.0), others=1.5),
           _device_run(4, 32.0, (0.0, 0.0015, 5.5, 0.1875, 0.5))]


def _by_count(records):
    by_count = {}
    for r in records:
        by_count.setdefault(r['count'], []).append(r)
    return by_count


def test_slope_is_the_least_squares_growth_per_unit():
    assert scaling.slope([1, 2, 4, 8], [1.0, 3.0, 7.0, 15.0]) == 2.0
    assert scaling.slope([1, 2, 4], [5.0, 5.0, 5.0]) == 0.0


def test_a_job_is_as_fast_as_its_slowest_worker_and_pools_their_steps():
    job = _job(2, 6400.0, [[0.0625, 0.1875], [0.125, 0.25]])
    assert job['value'] == 6400.0 and [w['rank'] for w in job['workers']] == [0, 1]
    assert scaling.phase_ms(job, 'push/pull') == 156.25
    # Per step: a worker's forward+backward plus its push/pull, then the median of the 4.
    assert scaling.phase_ms(job, 'phases added up') == 531.25


def test_device_rows_leave_out_disturbed_runs_and_keep_them_in_raw():
    lines = scaling.rows(_by_count(RECORDS), 256, scaling.DEVICE_PHASES + ('phases added up',))
    assert lines == [
        '| 1 | 256 | 75.0 (50.0-100.0, 2) | 1.00 | 3413.3 | 0.00 (0.00-0.00) | 0.00 (0.00-0.00) '
        '| 3500.0 (3000.0-4000.0) | 0.00 (0.00-0.00) | 125.0 (125.0-125.0) '
        '| 3625.0 (3125.0-4125.0) | 1.75 | 0.01 | 50.0 (0.01), 100.0 (0.01) |',
        '| 2 | 128 | 64.0 (64.0-64.0, 1) | 0.85 | 4000.0 | 0.00 | 0.50 | 3500.0 | 62.5 | 250.0 '
        '| 3813.0 | 1.75 | 0.01 | 64.0 (0.01), 8.0* (1.50) |',
        '| 4 | 64 | 32.0 (32.0-32.0, 1) | 0.43 | 8000.0 | 0.00 | 1.50 | 5500.0 | 187.5 | 500.0 '
        '| 6189.0 | 1.75 | 0.01 | 32.0 (0.01) |']


def test_growth_names_the_phases_by_how_fast_they_grow():
    text = scaling.growth_text(_by_count(RECORDS), 256, scaling.DEVICE_PHASES, 'device')
    assert text == (
        'From 1 to 4 devices the step (from the images/s) goes from 3413.3 to 8000.0 ms, '
        '+1596.2 ms per extra device (least-squares slope over 1, 2, 4). Per extra device, '
        'with waits: forward+backward +714.29 ms (3500.0 to 5500.0 ms); update +125.00 ms '
        '(125.0 to 500.0 ms); gradient sum +62.50 ms (0.00 to 187.5 ms); copies +0.50 ms '
        '(0.00 to 1.50 ms); split +0.00 ms (0.00 to 0.00 ms).')


def test_the_launcher_starts_one_server_and_the_workers_with_the_config():
    argv = scaling.job_command({'kind': 'dist'}, 4)
    assert argv[1:8] == ['-m', 'gluon_mgpu.launch', '-n', '4', '-s', '1', '--']
    assert argv[-2:] == [os.path.join(scaling.HERE, 'worker.py'), '{"kind": "dist"}']


def test_report_only_without_records_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        scaling.main(['--report-only', '--out', str(tmp_path / 'scaling.md')])
    assert e.value.code == 2
    assert capsys.readouterr().err == ('scaling.py: error: no raw records at %s: run without '
                                       '--report-only\n' % (tmp_path / 'scaling.json'))


def test_a_smoke_run_says_so_and_how_to_reproduce_it():
    raw = {'records': RECORDS, 'retries': 0, 'quick': True,
           'runs': [{'start': '2026-11-22 17:46 UTC', 'end': '2026-11-22 17:51 UTC',
                     'what': 'devices'}],
           'configs': {'devices': scaling.device_config(1, quick=True),
                       'workers': scaling.job_config(quick=True)},
           'machine': {'cpu': 'AMD EPYC', 'cores': 2, 'python': '3.11.7', 'mxnet': '1.9.1',
                       'platform': 'Linux', 'load': '0.5, 0.4, 0.3'}}
    lines = scaling.report(raw)
    assert lines[:7] == [
        '# How cost grows with devices and workers', '',
        'Written by `lab/scaling.py` --quick (a smoke run, NOT representative) from the '
        'raw records in [scaling.json](scaling.json); do not edit by hand.', '',
        '- when: 2026-11-22 17:46 UTC to 2026-11-22 17:51 UTC: devices',
        '- machine: AMD EPYC, 2 usable cores; Python 3.11.7, MXNet 1.9.1; Linux. Load average '
        'at the end: 0.5, 0.4, 0.3.',
        '- 5 measurements, 1 disturbed (the rest of the machine kept more than 0.2 cores busy '
        'on average; none was measured again: --retries 0).']
    assert '## LeNet in a dist_sync job of 1, 2 and 4 workers' not in lines
    assert 'global batch 256, one fresh process per measurement: 1 timed step after 1 warm-up ' \
        'step of' in lines[12]
    assert lines[-1] == ('Reproduce: `.venv/bin/python lab/scaling.py --quick` (one '
                         'table: `--part devices`, `--part workers` or `--part horovod`; the '
                         'two jobs interleaved: `--part jobs`).')
