"""examples/nightly/: the files parse, the wrapper maps exit codes, every `tune` command line uses
only options the real CLI defines, and no file holds a secret."""

from __future__ import annotations

import configparser
import datetime
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml

import prefill_tuner.cli
from prefill_tuner.objectives.slo import parse_slos
from tests.conftest import ROOT
from tests.test_real_engine_study import processes_using

NIGHTLY = ROOT / "examples" / "nightly"
WRAPPER = NIGHTLY / "tune-nightly.sh"
FILES = (
    "README.md",
    "tune-nightly.sh",
    "crontab",
    "tune-nightly.service",
    "tune-nightly.timer",
    "tune.env.example",
    "k8s-cronjob.yaml",
    "k8s-workers-job.yaml",
)
KINDS = {
    "k8s-cronjob.yaml": ["Secret", "PersistentVolumeClaim", "CronJob"],
    "k8s-workers-job.yaml": ["Job", "Job"],
}
WRAPPER_SETS = {"--study", "--trace", "--report-dir", "--log-dir"}
"""Options tune-nightly.sh passes to tune nightly itself (its callers must not)."""
CLI = typer.main.get_command(prefill_tuner.cli.app)
"""The `tune` command as the console script builds it (typer's click, duck-typed: a group has
``commands``; an option has ``param_type_name == "option"``, ``opts`` and ``secondary_opts``)."""


def _subcommands(command: Any) -> dict[str, Any]:
    return getattr(command, "commands", None) or {}


# --- finding the command lines ---------------------------------------------------------------
@dataclass(frozen=True)
class Command:
    where: str
    path: tuple[str, ...]  # ("nightly",), ("trace", "stats")
    args: tuple[str, ...]
    wrapper: bool = False  # tune-nightly.sh STUDY ARGS: ARGS go to tune nightly

    @property
    def name(self) -> str:
        return "tune " + " ".join(self.path)


def _is_operator(token: str) -> bool:
    return bool(token) and all(c in ";&|<>()" for c in token)


def _tokens(text: str) -> list[str]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.commenters = ""  # commands in comments are checked too
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:  # prose with an apostrophe
        return text.split()


def _commands_in_tokens(tokens: list[str], where: str) -> list[Command]:
    """`tune SUBCOMMAND ARGS` and `tune-nightly.sh STUDY ARGS` with at least one option (without
    one, it is prose: "runs tune nightly")."""
    found = []
    for i, token in enumerate(tokens):
        base, rest = token.rsplit("/", 1)[-1], tokens[i + 1 :]
        path: list[str] = []
        wrapper = base == "tune-nightly.sh" and bool(rest) and rest[0][:1] not in ("-", ";", "&")
        if wrapper:
            path, rest = ["nightly"], rest[1:]
        elif base == "tune":
            group = CLI
            while rest and rest[0] in _subcommands(group):
                path.append(rest[0])
                group = _subcommands(group)[rest[0]]
                rest = rest[1:]
            if not path and rest and rest[0] == "nightly":  # unregistered: fails as unknown
                path, rest = ["nightly"], rest[1:]
        args = _until_operator(rest)
        if path and any(a.startswith("-") for a in args):
            found.append(Command(where, tuple(path), args, wrapper))
    return found


def _until_operator(tokens: list[str]) -> tuple[str, ...]:
    out = []
    for token in tokens:
        if _is_operator(token):
            break
        out.append(token)
    return tuple(out)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Lines with their backslash continuations joined, and the number of the first."""
    out: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        if not pending:
            start = number
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            pending.append(stripped[:-1])
            continue
        pending.append(line)
        out.append((start, " ".join(pending)))
        pending = []
    if pending:
        out.append((start, " ".join(pending)))
    return out


def _code_in_markdown(text: str) -> str:
    """The code of a Markdown text, line for line: fenced blocks whole, and of other lines their
    inline code spans (separated by ";")."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            lines.append("")
        else:
            lines.append(line if fenced else " ; ".join(re.findall(r"`([^`]+)`", line)))
    return "\n".join(lines)


def _containers(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        found = [c for key in ("containers", "initContainers") for c in node.get(key) or []]
        return found + [c for value in node.values() for c in _containers(value)]
    if isinstance(node, list):
        return [c for item in node for c in _containers(item)]
    return []


def _docs(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((NIGHTLY / name).read_text()) if doc]


def find_commands() -> list[Command]:
    commands = []
    for name in FILES:
        text = (NIGHTLY / name).read_text()
        if name.endswith(".md"):
            text = _code_in_markdown(text)
        for number, line in _logical_lines(text):
            commands += _commands_in_tokens(_tokens(line), f"{name}:{number}")
        if name.endswith(".yaml"):
            for doc in _docs(name):
                for container in _containers(doc):
                    argv = [*container.get("command", []), *container.get("args", [])]
                    where = f"{name}:{doc['metadata']['name']}/{container['name']}"
                    commands += _commands_in_tokens([str(a) for a in argv], where)
    return commands


COMMANDS = find_commands()


def _options(path: tuple[str, ...]) -> dict[str, bool] | None:
    """The options of a `tune` subcommand (name: whether it takes a value), or None."""
    command = CLI
    for part in path:
        if part not in _subcommands(command):
            return None
        command = _subcommands(command)[part]
    return {
        opt: not (param.is_flag or param.count)
        for param in command.params
        if param.param_type_name == "option"
        for opt in (*param.opts, *param.secondary_opts)
    }


def _given_options(command: Command, options: dict[str, bool]) -> list[str]:
    given, skip = [], False
    for token in command.args:
        if skip:
            skip = False
            continue
        if token.startswith("-") and len(token) > 1:
            name = token.split("=", 1)[0]
            given.append(name)
            skip = options.get(name, False) and "=" not in token
    return given


# --- the files ---------------------------------------------------------------------------------
def test_every_file_is_there() -> None:
    assert sorted(p.name for p in NIGHTLY.iterdir()) == sorted(FILES)


def test_the_commands_are_found() -> None:
    """The extraction finds every scheduler's command (or the checks below would be vacuous)."""
    wheres = {c.where.split(":")[0] for c in COMMANDS if c.path == ("nightly",)}
    assert wheres >= {
        "README.md",
        "tune-nightly.sh",
        "crontab",
        "tune-nightly.service",
        "k8s-cronjob.yaml",
    }
    assert {c.name for c in COMMANDS if c.where.startswith("k8s-workers-job.yaml")} >= {
        "tune run",
        "tune worker",
    }


@pytest.mark.parametrize("name", sorted(KINDS))
def test_yaml_parses_with_the_expected_kinds(name: str) -> None:
    docs = _docs(name)
    assert [doc["kind"] for doc in docs] == KINDS[name]
    for container in _containers(docs):
        for key in ("command", "args"):  # Kubernetes takes strings only
            assert all(isinstance(a, str) for a in container.get(key, [])), (name, key)
        env = {e["name"]: e for e in container.get("env", [])}
        for secret in ("TUNE_STORAGE", "HF_TOKEN"):
            assert "value" not in env[secret]
            assert env[secret]["valueFrom"]["secretKeyRef"]["key"] == secret
        resources = container["resources"]
        assert resources["limits"]["nvidia.com/gpu"] == 1
        assert resources["requests"]["nvidia.com/gpu"] == 1
        assert any(m["mountPath"] == "/data" for m in container["volumeMounts"])


def _deadline(args: tuple[str, ...] | list[str]) -> int:
    return int(args[list(args).index("--deadline") + 1])


def test_cronjob() -> None:
    secret, claim, cronjob = _docs("k8s-cronjob.yaml")
    assert "data" not in secret and set(secret["stringData"]) == {"TUNE_STORAGE", "HF_TOKEN"}
    assert "ReadWriteMany" in claim["spec"]["accessModes"]
    spec = cronjob["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    job = spec["jobTemplate"]["spec"]
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert container["command"][-1].endswith("tune-nightly.sh")
    # the Job outlives tune nightly's own deadline, with room for the trial in flight
    assert _deadline(container["args"]) + 600 <= job["activeDeadlineSeconds"]
    assert {
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["volumes"]
        if "persistentVolumeClaim" in v
    } == {claim["metadata"]["name"]}


def test_workers_job() -> None:
    create, workers = _docs("k8s-workers-job.yaml")
    (create_container,) = create["spec"]["template"]["spec"]["containers"]
    (worker,) = workers["spec"]["template"]["spec"]["containers"]
    assert (
        create_container["command"] == ["tune", "run"]
        and "--create-only" in create_container["args"]
    )
    assert worker["command"] == ["tune", "worker"]

    def study(args: list[str]) -> str:
        return args[args.index("--study") + 1]

    assert study(worker["args"]) == study(create_container["args"])
    spec = workers["spec"]
    assert spec["parallelism"] == spec["completions"] >= 2
    assert workers["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] > 0


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((NIGHTLY / name).read_text())
    return parser


def _seconds(value: str) -> int:
    units = {"s": 1, "min": 60, "h": 3600}
    match = re.fullmatch(r"(\d+)(s|min|h)?", value.strip())
    assert match, value
    return int(match[1]) * units[match[2] or "s"]


def test_systemd_units() -> None:
    service = _unit("tune-nightly.service")["Service"]
    assert service["Type"] == "oneshot"
    assert "3" in service["SuccessExitStatus"].split()
    assert service["EnvironmentFile"] == "/etc/tune/tune.env"
    exec_start = _tokens(service["ExecStart"].replace("\\\n", " "))
    assert exec_start[0].endswith("tune-nightly.sh")
    assert _deadline(exec_start) + 600 <= _seconds(service["TimeoutStartSec"])
    timer = _unit("tune-nightly.timer")
    assert timer["Timer"]["OnCalendar"]
    assert timer["Install"]["WantedBy"] == "timers.target"


def test_crontab() -> None:
    entries = [
        line
        for line in (NIGHTLY / "crontab").read_text().splitlines()
        if line.strip() and not line.startswith("#") and not re.match(r"\w+=", line)
    ]
    assert len(entries) == 1
    assert "%" not in entries[0], "cron turns % into a newline"
    fields = entries[0].split(None, 6)
    assert len(fields) == 7 and fields[5] == "root"  # /etc/cron.d format: a user column
    assert ". /etc/tune/tune.env" in fields[6]


def test_the_wrapper_is_valid_bash() -> None:
    subprocess.run(["bash", "-n", str(WRAPPER)], check=True)
    assert os.access(WRAPPER, os.X_OK)


# --- every command line uses options the CLI defines ---------------------------------------
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: f"{c.where}:{c.name}")
def test_command_uses_only_real_options(command: Command) -> None:
    options = _options(command.path)
    assert options is not None, f"{command.where}: {command.name} is not a subcommand of tune"
    given = _given_options(command, options)
    unknown = [name for name in given if name not in options]
    assert not unknown, f"{command.where}: {command.name} has no option {', '.join(unknown)}"
    if command.wrapper:
        assert not set(given) & WRAPPER_SETS, f"{command.where}: tune-nightly.sh sets these"


WRAPPER_ARGS = ("--study", "prod", "--trace", "t.jsonl", "--report-dir", "r", "--log-dir", "l")


@pytest.mark.parametrize(
    "command",
    [c for c in COMMANDS if not {"...", "$@"} & set(c.args)],  # complete lines only
    ids=lambda c: f"{c.where}:{c.name}",
)
def test_command_parses(command: Command) -> None:
    """The CLI's own parser takes the line: values convert, required options are there, and
    the SLOs are valid."""
    subcommand = CLI
    for part in command.path:
        subcommand = _subcommands(subcommand)[part]
    args = [*WRAPPER_ARGS, *command.args] if command.wrapper else list(command.args)
    context = subcommand.make_context(" ".join(command.path), args)
    if context.params.get("slo"):
        parse_slos(context.params["slo"])


def test_the_option_check_catches_a_wrong_option() -> None:
    (good,) = _commands_in_tokens(shlex.split("tune worker --study s --grace 90 --name x"), "t")
    (bad,) = _commands_in_tokens(shlex.split("tune worker --study s --trials 3"), "t")
    options = _options(good.path)
    assert options is not None
    assert _given_options(good, options) == ["--study", "--grace", "--name"]
    assert "--trials" not in options and "--trials" in _given_options(bad, options)
    assert _options(("no-such-command",)) is None


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: f"{c.where}:{c.name}")
def test_no_secret_on_a_command_line(command: Command) -> None:
    assert "--storage" not in command.args, f"{command.where}: pass TUNE_STORAGE instead"
    for arg in command.args:
        assert not re.search(r"TOKEN=|://[^/@\s]*:[^/@\s]*@", arg), f"{command.where}: {arg}"


# --- no secrets ---------------------------------------------------------------------------------
REAL_SECRETS = (
    r"hf_[A-Za-z0-9]{30,}",
    r"\b(?:ghp|gho|ghs|github_pat)_[A-Za-z0-9_]{20,}",
    r"\bAKIA[0-9A-Z]{16}\b",
    r"\bxox[abprs]-[A-Za-z0-9-]{10,}",
    r"\bsk-[A-Za-z0-9]{20,}",
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
)
PLACEHOLDER = re.compile(r"(?:hf_)?[A-Z][A-Z_]*|\*+|\$\{?\w+\}?")


def secret_problems(text: str) -> list[str]:
    """What in a text looks like a real secret rather than a placeholder."""
    problems = [pattern for pattern in REAL_SECRETS if re.search(pattern, text)]
    for password in re.findall(r"\b[a-z][a-z0-9+.-]*://[^:/@\s]+:([^@\s]+)@", text):
        if not PLACEHOLDER.fullmatch(password):
            problems.append(f"a password in a URL: {password}")
    key = r"(HF_TOKEN|HUGGING_FACE_HUB_TOKEN|\w*(?:TOKEN|PASSWORD|SECRET|API_KEY))"
    assignments = [  # KEY=value anywhere (shell, env files, --server-env), KEY: value in YAML
        *re.findall(rf"\b{key}=([^\s\"',}}]+)", text),
        *re.findall(rf"(?m)^[ \t-]*{key}:[ \t]*([^\s,}}]+)", text),
    ]
    problems += [f"{k} holds {v}" for k, v in assignments if not PLACEHOLDER.fullmatch(v)]
    return problems


@pytest.mark.parametrize("name", FILES)
def test_no_real_secret(name: str) -> None:
    assert secret_problems((NIGHTLY / name).read_text()) == []


def test_the_secret_check_catches_secrets() -> None:
    fine = (
        "TUNE_STORAGE=postgresql+psycopg://tuner:PASSWORD@db:5432/t\n  HF_TOKEN: hf_PLACEHOLDER\n"
    )
    assert secret_problems(fine) == []
    for leak in (
        "TUNE_STORAGE=postgresql+psycopg://tuner:s3cr3t@db:5432/t",
        "  HF_TOKEN: hf_abc123",
        "--server-env HF_TOKEN=abc123",
        "token hf_" + "aB3" * 12,
    ):
        assert secret_problems(leak), leak


# --- the wrapper's behaviour, with a fake `tune` ------------------------------------------------
FAKE_TUNE = """#!{python}
import json, os, signal, sys, time
from pathlib import Path

# As tune (prefill_tuner.stopping), which sets its own handlers: the first Ctrl-C raises, even
# where the shell ignored SIGINT; every later one is ignored (the wrapper repeats its stop).
stopping = []


def stop(signum, frame):
    if not stopping:
        stopping.append(signum)
        raise KeyboardInterrupt


signal.signal(signal.SIGINT, stop)

out = Path(os.environ["FAKE_OUT"])
out.write_text(json.dumps(sys.argv[1:]))
if os.environ.get("FAKE_WAIT"):  # as tune: Ctrl-C (SIGINT) ends in 130, SIGTERM kills
    try:
        Path(str(out) + ".ready").touch()
        time.sleep(30)
    except KeyboardInterrupt:
        Path(str(out) + ".interrupted").touch()
        sys.exit(130)
sys.exit(int(os.environ.get("FAKE_RC", "0")))
"""


@pytest.fixture
def wrapper_env(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "tune"
    fake.write_text(FAKE_TUNE.format(python=sys.executable))
    fake.chmod(0o755)
    (tmp_path / "traces" / "prod").mkdir(parents=True)
    (tmp_path / "traces" / "prod" / "2026-01-14.jsonl").write_text("{}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNE_", "HF_"))}
    return env | {
        "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}",
        "FAKE_OUT": str(tmp_path / "args.json"),
        "TUNE_TRACE_DIR": str(tmp_path / "traces"),
        "TUNE_REPORT_DIR": str(tmp_path / "reports"),
        "TUNE_LOG_DIR": str(tmp_path / "logs"),
        "TUNE_DAY": "2026-01-14",
        "TUNE_ON_PROMOTE": f'echo "promote $TUNE_EXIT $TUNE_STUDY $TUNE_OUT" > {tmp_path}/hook',
        "TUNE_ON_ALERT": f'echo "alert $TUNE_EXIT $TUNE_STUDY $TUNE_DAY" > {tmp_path}/hook',
    }


def _wrap(env: dict[str, str], *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(WRAPPER), *args], env=env | extra, capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize(
    ("tune_rc", "wrapper_rc", "hook"),
    [(0, 0, None), (3, 0, "promote 3"), (4, 4, "alert 4"), (2, 2, "alert 2"), (1, 1, "alert 1")],
)
def test_wrapper_maps_exit_codes(
    wrapper_env: dict[str, str], tmp_path: Path, tune_rc: int, wrapper_rc: int, hook: str | None
) -> None:
    done = _wrap(wrapper_env, "prod", "--trials", "3", FAKE_RC=str(tune_rc))
    assert done.returncode == wrapper_rc, done.stderr
    assert json.loads((tmp_path / "args.json").read_text()) == [
        "nightly",
        "--study",
        "prod",
        "--trace",
        f"{tmp_path}/traces/prod/2026-01-14.jsonl",
        "--report-dir",
        f"{tmp_path}/reports",
        "--log-dir",
        f"{tmp_path}/logs/prod",
        "--trials",
        "3",
    ]
    hook_file = tmp_path / "hook"
    if hook is None:
        assert not hook_file.exists()
    else:
        assert hook_file.read_text().startswith(f"{hook} prod ")


def test_wrapper_promotion_under_systemd_and_a_failing_hook(wrapper_env: dict[str, str]) -> None:
    assert _wrap(wrapper_env, "prod", FAKE_RC="3", TUNE_PROMOTED_EXIT="3").returncode == 3
    assert _wrap(wrapper_env, "prod", FAKE_RC="3", TUNE_ON_PROMOTE="false").returncode == 5


def test_wrapper_without_a_trace(wrapper_env: dict[str, str], tmp_path: Path) -> None:
    done = _wrap(wrapper_env, "prod", TUNE_DAY="2026-01-15")
    assert done.returncode == 2
    assert "no trace for 2026-01-15" in done.stderr
    assert not (tmp_path / "args.json").exists()
    assert (tmp_path / "hook").read_text().startswith("alert 2 prod 2026-01-15")


def test_wrapper_reads_yesterdays_trace(wrapper_env: dict[str, str], tmp_path: Path) -> None:
    days = {datetime.date.today() - datetime.timedelta(days=1)}
    env = {k: v for k, v in wrapper_env.items() if k != "TUNE_DAY"}
    for day in days:
        (tmp_path / "traces" / "prod" / f"{day}.jsonl").write_text("{}\n")
    assert _wrap(env, "prod").returncode == 0
    days.add(datetime.date.today() - datetime.timedelta(days=1))  # past midnight meanwhile
    trace = json.loads((tmp_path / "args.json").read_text())[4]
    assert trace in {f"{tmp_path}/traces/prod/{day}.jsonl" for day in days}


def test_wrapper_turns_sigterm_into_an_interrupt(
    wrapper_env: dict[str, str], tmp_path: Path
) -> None:
    """A stopped pod or unit (SIGTERM to the wrapper) interrupts tune as Ctrl-C would."""
    process = subprocess.Popen(
        ["bash", str(WRAPPER), "prod"], env=wrapper_env | {"FAKE_WAIT": "1"}, text=True
    )
    try:
        ready = tmp_path / "args.json.ready"
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 130
        assert (tmp_path / "args.json.interrupted").exists()
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.slow
def test_a_stop_at_any_moment_of_the_start_leaves_no_tune_running(
    wrapper_env: dict[str, str], tmp_path: Path
) -> None:
    """SIGTERM (as systemd or Kubernetes stop a job) from 0 to 45 ms after the wrapper starts,
    across the moment it starts tune: the wrapper always ends, and no tune (nor a shell about
    to become one) outlives it. (The wrapper once set its trap only after starting tune; a
    stop in between killed it and left tune running. That window is microseconds wide: these
    stops seldom land in it, so the trap's order is checked by reading, this by running.)"""
    fake = tmp_path / "bin" / "tune"
    for delay_ms in range(0, 50, 5):
        process = subprocess.Popen(
            ["bash", str(WRAPPER), "prod"],
            env=wrapper_env | {"FAKE_WAIT": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        left: list[int] = []
        try:
            time.sleep(delay_ms / 1000)  # the stimulus: when the stop comes, not a wait
            process.send_signal(signal.SIGTERM)
            # It ends; how depends on the moment: killed (before its trap), 130 (tune stopped
            # as by Ctrl-C), or 1 (Python stopped while it starts up, before any of tune).
            process.wait(timeout=20)
            left = processes_using(fake) + processes_using(WRAPPER)
            assert left == [], (delay_ms, left)
        finally:
            if process.poll() is None:
                process.kill()
            for pid in left:
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_the_wrapper_runs_a_night_on_the_simulator(tmp_path: Path) -> None:
    """The real tune behind the wrapper, on the simulator: without TUNE_LOG_DIR the wrapper
    passes no --log-dir (the simulator starts no server and refuses it), and the night runs
    (it used to end in exit 2 on its own --log-dir)."""
    traces = tmp_path / "traces" / "prod"
    traces.mkdir(parents=True)
    synth = [sys.executable, "-m", "prefill_tuner", "trace", "synth"]
    day = traces / "2026-01-14.jsonl"
    subprocess.run(
        [*synth, str(day), "--rate", "4", "--duration", "20", "--seed", "1"],
        check=True, capture_output=True,
    )  # fmt: skip
    tune_bin = tmp_path / "bin"
    tune_bin.mkdir()
    (tune_bin / "tune").symlink_to(Path(sys.executable).parent / "tune")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNE_", "HF_"))}
    env |= {
        "PATH": f"{tune_bin}{os.pathsep}{env['PATH']}",
        "TUNE_TRACE_DIR": str(tmp_path / "traces"),
        "TUNE_REPORT_DIR": str(tmp_path / "reports"),
        "TUNE_STORAGE": f"sqlite:///{tmp_path / 'tune.db'}",
        "TUNE_DAY": "2026-01-14",
    }
    done = subprocess.run(
        ["bash", str(WRAPPER), "prod", "--slo", "p99_tpot=100ms", "--trials", "3"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode in (0, 3), done.stderr
    assert (tmp_path / "reports" / "prod").is_dir()
