"""``python -m gluon_mgpu.train``: runs ``gluon_mgpu/commands/train.py`` (docs/outputs.md)."""
if __name__ == '__main__':
    from gluon_mgpu.runtime.startup import starting
    with starting('python -m gluon_mgpu.train'):  # a signal until main handles it: one line
        from gluon_mgpu.commands.train import main
    raise SystemExit(main())
