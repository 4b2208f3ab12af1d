"""Glue that registers each mechanism of ``reference/`` as a program ``simdevice`` knows.

One module per mechanism: its configuration class, value oracle and
``register(Program(...))`` call. ``simdevice.check.programs()`` imports every
module here.
"""
