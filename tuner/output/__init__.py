"""The output wing: what a study's result becomes beyond the terminal.

- :mod:`.documents`: the JSON documents (``--json``, ``tune export --format json``) and their
  schema;
- :mod:`.html`: the self-contained HTML report.
"""
