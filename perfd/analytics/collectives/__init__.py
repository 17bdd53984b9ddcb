"""What the collectives did: per-rank timings, groups, bandwidth, windows, hangs.
"""
