"""benchmarks/run.py's verdicts on the targets, from fixed medians (nothing is measured)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'benchmarks'))
import run  # noqa: E402


def _row(rows, start):
    return next(r for r in rows if r[0].startswith(start))


def test_a_ratio_that_rounds_to_its_goal_shows_enough_digits_to_see_the_verdict():
    two = '2 simulated devices at least as fast as 1'
    med = {'ours-hyb-1': 80.95, 'ours-hyb-2': 80.55}
    best = {'ours-hyb-1': 81.6, 'ours-hyb-2': 81.4}
    assert _row(run.targets(med, best), two)[1:] == ('0.995x', '0.998x', False)
    med['ours-hyb-2'] = 81.35
    assert _row(run.targets(med, best), two)[1:] == ('1.005x', '0.998x', True)
    # Far from the goal, two decimals.
    med['ours-hyb-2'] = 74.8
    assert _row(run.targets(med, best), two)[1:] == ('0.92x', '0.998x', False)
