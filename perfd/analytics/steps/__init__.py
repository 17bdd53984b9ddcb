"""What each step did, and the run's steady state: per-iteration metrics (MFU, shares, pipeline,
stragglers), the steady window and its summary, goodput.
"""
