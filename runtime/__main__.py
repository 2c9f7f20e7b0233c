"""``python -m trainforge``: the same CLI as the ``trainforge`` script. Job entrypoints use it
(`trainforge submit`): it works wherever the package imports, even with no script on PATH."""

from trainforge.cli import run

run()
