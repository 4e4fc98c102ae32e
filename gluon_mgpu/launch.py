"""``python -m gluon_mgpu.launch``: runs ``gluon_mgpu/commands/launch.py`` (docs/distributed.md)."""
if __name__ == '__main__':
    from gluon_mgpu.runtime.startup import starting
    with starting('python -m gluon_mgpu.launch'):  # a signal until main handles it: one line
        from gluon_mgpu.commands.launch import main  # its flags come first
    raise SystemExit(main())
