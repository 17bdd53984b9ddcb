"""Capture analysis: the HTA breakdown of nsys (SQLite export) and Kineto (Chrome trace) timelines.

``analysis`` is pure (interval arithmetic over parsed events); ``nsys_sqlite`` and ``chrome_trace``
are the thin loaders that read files.
"""
