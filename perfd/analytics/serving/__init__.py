"""How an LLM server serves: request histograms, the model spec, the serving findings.
"""
