"""``tune worker``: any number of processes, on any machines, run the trials of one shared
study and record them in the same database (PostgreSQL across machines).

- :mod:`~prefill_tuner.worker.definition`: the study's plan, recorded by ``tune run`` and rebuilt by
  every worker;
- :mod:`~prefill_tuner.worker.shared`: a worker's handles on the shared study (Optuna's storage with
  heartbeats and retries of dead workers' trials);
- :mod:`~prefill_tuner.worker.claim`: the atomic claim of the next trial (exactly the target count);
- :mod:`~prefill_tuner.worker.heartbeat`: the heartbeat thread of a running trial;
- :mod:`~prefill_tuner.worker.loop`: the worker's loop.
"""
