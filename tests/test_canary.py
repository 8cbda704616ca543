"""The whole CLI under a canary secret (a database password, in a URL and in $TUNE_STORAGE):
run, create-only, worker, pareto, export, report, studies, trials, nightly and their error
paths; the canary is nowhere
in what they print, in any file they write, or in any row of the database. So are the secrets
inside server arguments' values (a tracing endpoint's URL password, a KV connector's JSON
password): in a server's own log as the launcher writes it, and through a real vLLM study.
(The real engine's --api-key and HF_TOKEN are planted the same way in
tests/test_real_engine_study.py.)"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from prefill_tuner.engines.real.launcher import ServerSpec, ServerStartError, VllmServer
from prefill_tuner.redaction import remember, secret_values
from prefill_tuner.storage.store import TunerStore
from tests.conftest import AZURE
from tests.test_real_engine_study import KV_BYTES, vllm_run, workspace

__all__ = ["workspace"]  # the real-engine tests' fixture: a tiny model and a short trace

CANARY = "pw-canary-5e1d9b"


def _with_password(url: str) -> str:
    """The same database with a password in the URL (trust authentication ignores it)."""
    scheme, rest = url.split("://", 1)
    user, host = rest.split("@", 1)
    return f"{scheme}://{user}:{CANARY}@{host}"


def _database_text(url: str) -> str:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            names = inspect(connection).get_table_names()
            rows = [
                repr(row)
                for name in names
                for row in connection.execute(text(f'SELECT * FROM "{name}"'))
            ]
    finally:
        engine.dispose()
    return "\n".join(rows)


@pytest.mark.slow
def test_a_password_canary_is_found_nowhere(
    tune, tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret_url = _with_password(postgres_url)
    said: list[str] = []

    def run(*args: str, expect: int | None = 0) -> None:
        code, out, err = tune(*args)
        said.extend([out, err])
        if expect is not None:
            assert code == expect, err

    trace = ["--trace", str(AZURE), "--max-requests", "60", "--slo", "p99_tpot=50ms"]
    run("run", *trace, "--trials", "3", "--storage", secret_url, "--study", "c")
    run("pareto", "--storage", secret_url, "--study", "c")
    run("pareto", "--storage", secret_url, "--study", "c", "--json")
    run("report", "--storage", secret_url, "--study", "c", "-o", str(tmp_path / "c.html"))
    run("studies", "--storage", secret_url, "--json")
    run("trials", "--storage", secret_url, "--study", "c")
    for fmt in ("shell", "yaml", "json"):
        run("export", "--format", fmt, "-o", str(tmp_path / f"x.{fmt}"), "--storage", secret_url)
    # From the environment, as the README recommends, for workers.
    monkeypatch.setenv("TUNE_STORAGE", secret_url)
    run("run", *trace, "--trials", "4", "--study", "w", "--create-only")
    run("worker", "--study", "w", "--heartbeat", "1", "--grace", "5")
    monkeypatch.delenv("TUNE_NO_REPORT")  # the night's HTML report too
    run(
        "nightly", "--study", "n", *trace, "--trials", "3", "--repeats", "1",
        "--report-dir", str(tmp_path / "reports"), expect=None,
    )  # fmt: skip
    # Error paths: an unknown study, an unreachable server, a resume that is refused.
    run("pareto", "--study", "nope", expect=2)
    unreachable = secret_url.replace("127.0.0.1:5432", "127.0.0.1:1")
    run("pareto", "--storage", unreachable, "--study", "c", expect=None)
    run("run", *trace, "--trials", "3", "--study", "c", "--error-budget", "0.5", expect=2)

    assert len(list(tmp_path.rglob("*.html"))) == 2  # tune report's and the night's
    assert CANARY not in "\n".join(said)
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert CANARY not in path.read_text(errors="replace"), path
    stored = _database_text(postgres_url)
    assert "p99_tpot=50ms" in stored and "vllm serve" in stored  # the rows were read
    assert CANARY not in stored
    assert "***" in "\n".join(said)  # the URL was shown, masked


URL_CANARY = "url-canary-3c7a"
JSON_CANARY = "json-canary-9b2e"
CANARIES = (URL_CANARY, JSON_CANARY)
SECRET_ARGS = [
    "--otlp-traces-endpoint",
    f"http://u:{URL_CANARY}@127.0.0.1:9",
    "--kv-transfer-config",
    json.dumps({"kv_connector": "X", "kv_connector_extra_config": {"password": JSON_CANARY}}),
]
FAKE_SERVER = """
import http.server, json, sys
args = sys.argv[1:]
kv_config = json.loads(args[args.index("--kv-transfer-config") + 1])
print("non-default args:", args, flush=True)
print("exporting to", args[args.index("--otlp-traces-endpoint") + 1], file=sys.stderr, flush=True)
print("connector password", kv_config["kv_connector_extra_config"]["password"], flush=True)
if "--fail" in args:
    sys.exit("RuntimeError: cannot reach " + args[args.index("--otlp-traces-endpoint") + 1])

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *parts):
        print("served", self.path, flush=True)

http.server.HTTPServer(("127.0.0.1", int(args[args.index("--port") + 1])), Health).serve_forever()
"""


def _fake_server(tmp_path: Path, *extra: str) -> ServerSpec:
    """A server that prints its arguments, the secrets among them, as vLLM's log does."""
    remember(secret_values(SECRET_ARGS))  # as the real engine does with the arguments given
    return ServerSpec(
        model="m",
        args=[*SECRET_ARGS, *extra],
        serve_command=[sys.executable, "-c", FAKE_SERVER],
        log_path=tmp_path / "server.log",
        startup_timeout_s=60,
    )


def test_a_servers_own_log_hides_the_secrets_in_its_arguments(tmp_path: Path) -> None:
    """The server gets the real values; its log, as it is written, never holds them."""
    spec = _fake_server(tmp_path)
    with VllmServer(spec) as server:
        assert all(secret in " ".join(server.spec.command(1)) for secret in CANARIES)
    log = spec.log_path.read_text()  # whole once the server is stopped
    assert "served /health" in log and "non-default args:" in log
    assert "http://u:***@127.0.0.1:9" in log
    assert '"password": "<redacted>"' in log or "'password': '<redacted>'" in log, log
    assert not [secret for secret in CANARIES if secret in log], log


def test_a_failed_servers_log_and_reason_hide_the_secrets(tmp_path: Path) -> None:
    spec = _fake_server(tmp_path, "--fail")
    with pytest.raises(ServerStartError) as failed:
        VllmServer(spec).__enter__()
    log = spec.log_path.read_text()
    assert "RuntimeError: cannot reach http://u:***@127.0.0.1:9" in failed.value.reason
    assert "RuntimeError: cannot reach" in log.splitlines()[-1]  # the whole log, its end too
    assert not [secret for secret in CANARIES if secret in log + failed.value.reason], log


@pytest.mark.real_engine
def test_secrets_inside_server_arguments_are_found_nowhere(tune, workspace: Path) -> None:
    """A URL's password (a tracing endpoint) and a JSON field (a KV connector's config) in
    ``--server-arg``s, on real vLLM: the server gets the real values; its log under
    ``--log-dir``, the database, every file written and everything printed never do."""
    kv_store = workspace / "kv"
    kv_config = {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "shared_storage_path": str(kv_store),
            "password": JSON_CANARY,
        },
    }
    said: list[str] = []

    def run(*args: str) -> None:
        code, out, err = tune(*args)
        said.extend([out, err])
        assert code == 0, err

    code, out, err = vllm_run(
        tune,
        workspace,
        1,
        "--server-arg",
        f"{KV_BYTES} --otlp-traces-endpoint http://u:{URL_CANARY}@127.0.0.1:9",
        "--server-arg",
        f"--kv-transfer-config {shlex.quote(json.dumps(kv_config))}",
    )
    said.extend([out, err])
    assert code == 0, err
    storage = ("--storage", f"sqlite:///{workspace / 'tune.db'}")
    run("pareto", *storage, "--study", "real")
    run("trials", *storage, "--study", "real")
    run("report", *storage, "--study", "real", "-o", str(workspace / "real.html"))
    for fmt in ("shell", "yaml", "json"):
        run("export", "--format", fmt, "-o", str(workspace / f"export.{fmt}"), *storage)

    (trial,) = TunerStore(storage[1]).trials(TunerStore(storage[1]).get_study("real"))
    assert trial.status == "complete", trial.failure_reason
    assert any(kv_store.iterdir())  # the server's connector had its real config
    written = [path for path in workspace.rglob("*") if path.is_file()]
    assert (workspace / "real.html") in written and (workspace / "export.yaml") in written
    leaks = {
        canary: [path.name for path in written if canary.encode() in path.read_bytes()]
        + [f"output {n}" for n, text in enumerate(said) if canary in text]
        for canary in CANARIES
    }
    assert leaks == {canary: [] for canary in CANARIES}
    # Shown, hidden: in the serve line, and in the server's log (vLLM logs its arguments).
    assert "http://u:***@127.0.0.1:9" in trial.serve_command
    assert '"password": "<redacted>"' in trial.serve_command
    logs = [path.read_text() for path in (workspace / "logs").glob("*.log")]
    assert logs and any("u:***@127.0.0.1:9" in log for log in logs)
