"""The ground floor of perfd: the definitions every layer shares (the data model, the event and
metric catalogs, the limits and thresholds, the typed checks, the clock) and small pure helpers over
them. A module here imports the standard library, third-party packages and other modules of
perfd.core, nothing else of perfd (tests/test_layering.py checks it); everything above may import it.
This file imports nothing: importing one module of the floor loads no other.
"""
