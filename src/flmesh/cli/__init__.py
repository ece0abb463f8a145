"""flmesh.cli: the commands (``fl-sim``, ``fl-node`` and its aggregator role, ``fl-certs``,
``fl-deploy``, ``fl-sim report`` and ``compare``, the health probe).

Each reads its flags before anything heavy is imported, so ``--help`` and a bad flag answer at
once (tests/test_imports.py checks it).

May import: everything.
"""
