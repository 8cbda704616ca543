"""Persistence of runs, trials, engine versions, resolved configs, metrics and step traces
(SQLAlchemy 2; SQLite by default, PostgreSQL for shared studies)."""
