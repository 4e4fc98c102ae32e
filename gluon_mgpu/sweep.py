"""``python -m gluon_mgpu.sweep``: runs ``gluon_mgpu/commands/sweep.py`` (docs/outputs.md)."""
import sys

if __name__ == '__main__':
    from gluon_mgpu.commands.sweep import main
    sys.exit(main())
