"""What to do about it: findings from a run's numbers, remedies fitted to the job's own configuration.
"""
