"""What Nsight Compute's kernel rows add to the budget, what they cost the armed ranks, their remedies.
"""
