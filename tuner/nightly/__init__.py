"""``tune nightly``: retune on the night's trace and promote only what is really better."""
