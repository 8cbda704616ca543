"""What ``tune`` exits with: one meaning per code, for every command and any pipeline."""

OK = 0
"""Done; for ``tune nightly``: the incumbent stays."""
FAILURE = 1
"""The system failed us: a full disk, a closed pipe, a failing database (one line on stderr)."""
BAD_INPUT = 2
"""Bad input (a file, an option, a value): one line on stderr, nothing done."""
PROMOTED = 3
"""``tune nightly``: a new configuration was promoted (new serve lines)."""
NOTHING_MEETS_SLOS = 4
"""No trial (``tune run``, ``tune pareto``) or configuration (``tune nightly``) met the SLOs."""
VERIFY_FAILED = 5
"""``tune verify`` (and ``tune nightly --verify``): chunked prefill changed the outputs; the
configuration must not be promoted."""
INTERRUPTED = 130
"""Ctrl-C or SIGTERM: finished trials are kept; the same command resumes."""
