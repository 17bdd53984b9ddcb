"""The run level, at the top of perfd.analytics: ``analyze_run(...) -> RunAnalysis`` (run_analysis),
the run's summary, figures, incidents and findings, and the runs of a job (a restart begins a new
run). It imports every other analytics package; none of them imports it."""
