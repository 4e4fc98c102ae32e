"""The small checks every layer uses: whole numbers, ASCII digits, an exception as one line.
Where a reader looks for them: ``is_whole`` for a count given in Python, ``is_digits`` for one
read from text (an environment variable, a file), ``one_line`` for an error's message.
"""
import re
import sys

__all__ = ['LR_RANGE', 'is_whole', 'check_whole', 'is_digits', 'one_line']

# The learning rates MXNet's SGD operators take: float32's normal range, 2**-126 to its largest
# value (measured with 1.9.1: sgd_update refuses 3.5e38 and 1.1e-38 as "Out of range value").
LR_RANGE = (2.0 ** -126, (2 - 2.0 ** -23) * 2.0 ** 127)


def is_whole(value, least=1):
    """Whether ``value`` is a whole number (an ``int`` or a numpy integer, not a ``bool``) of at
    least ``least`` and below 2**63, the range MXNet's counts take."""
    import numbers
    return (isinstance(value, numbers.Integral) and not isinstance(value, bool)
            and least <= value < 2 ** 63)


def check_whole(name, value, fix):
    """``ValueError`` naming ``name``, ``value`` and ``fix`` unless ``is_whole(value)``:
    ``check_whole('num_epochs', 0, 'for example num_epochs=4')``."""
    if not is_whole(value):
        shown = repr(value) if not isinstance(value, int) or abs(value) < 10 ** 20 else \
            'a number of %d digits' % len(str(abs(value)))
        raise ValueError('%s must be a whole number >= 1, got %s; %s' % (name, shown, fix))


def is_digits(text):
    """Whether ``text`` is ASCII digits only, so ``int(text)`` reads it: ``str.isdigit()`` also
    accepts '²', which ``int()`` refuses, and Python's ``int()`` refuses more than 4300 digits
    (``sys.get_int_max_str_digits()``)."""
    return (re.fullmatch(r'[0-9]+', text) is not None
            and len(text) <= (sys.get_int_max_str_digits() or len(text)))


def one_line(e, limit=300):
    """An exception's message as one line of at most ``limit`` characters: of an MXNet error
    (a C++ stack trace, then ``MXNetError: message``), the message without its prefix."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    line = lines[-1] if 'Traceback' in lines[0] else lines[0]
    for prefix in ('MXNetError: ', type(e).__name__ + ': '):
        if line.startswith(prefix):
            line = line[len(prefix):]
    return line if len(line) <= limit else line[:limit - 3] + '...'
