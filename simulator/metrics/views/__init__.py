"""The views of a finished run, one module per concept: each reads the run's data (the
request records, the instances' end-of-run records, the PD and fleet state) and returns a
table or a dict. `metrics.results.Result` exposes them as cached attributes; none of these
modules imports it, so every view sits below the result that shows it."""
