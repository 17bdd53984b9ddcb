"""What went wrong when, and why: incidents over the steps, stalls, the evidence gathered for them and
the verdict read from it.
"""
