"""Where a step's time goes, and the job's class: the step budget from a timeline (kernels charged by
the op that launched them), the class's votes, the budget's findings.
"""
