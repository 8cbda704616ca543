"""The study wing: everything between a plan and its result.

- :mod:`.plan`: the study's plan (engine → space → shaping → trace), checked once;
- :mod:`.run`: the Optuna study (open, resume, the run lock, trials, recovery of stopped ones);
- :mod:`.first_trials`: the rule-derived settings tried after the baseline;
- :mod:`.evaluation`: judging one run against the SLOs (and capacity bisection);
- :mod:`.recommend`: which Pareto setting to recommend;
- :mod:`.infeasibility`: why nothing met the SLOs (the floors, the rate headroom);
- :mod:`.screening`: a real-engine study screened on the simulator;
- :mod:`.replica_count`: the fewest replicas behind a router;
- :mod:`.summary`: a stored study's result, as data (the CLI's tables and the output wing's
  documents and report are drawn from it).
"""
