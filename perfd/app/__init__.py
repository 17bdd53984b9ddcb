"""The user-facing entry points of perfd: the command line (cli, and its sub-commands in commands/),
the notebook API (api), `perfd launch`'s launcher and the demo. Nothing below imports this package
(tests/test_layering.py checks it). This file imports nothing.
"""
