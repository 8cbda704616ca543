"""Malformed input of any kind ends in the project's clear, located error, never a crash."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefill_tuner.errors import TraceError
from prefill_tuner.trace import read_trace
from tests.conftest import AZURE, BURSTGPT, MOONCAKE

SEEDS = {
    "jsonl": b"".join(MOONCAKE.read_bytes().splitlines(keepends=True)[:4]),
    "azure": b"".join(AZURE.read_bytes().splitlines(keepends=True)[:4]),
    "burstgpt": b"".join(BURSTGPT.read_bytes().splitlines(keepends=True)[:4]),
    # The benchmark tools' exports, cut to their fields (tests/data/tool_exports/ in full).
    "vllm-bench": b'{"backend": "openai", "request_rate": "inf", "max_concurrency": 2, '
    b'"input_lens": [5, 7], "output_lens": [3, 0], "start_times": [1.5, 2.5], '
    b'"queue_times": [0.1, 0.2], "errors": ["", "x"]}\n',
    "guidellm": b'{"benchmarks": [{"config": {"strategy": {"type_": "concurrent", "streams": 2}}, '
    b'"metrics": {"request_totals": {"total": 3}}, "requests": {"successful": [{"request_id": '
    b'"a", "prompt_tokens": 5, "output_tokens": 3, "info": {"timings": {"targeted_start": 1.5}}}'
    b'], "errored": [{}], "incomplete": []}}]}',
    "aiperf": b'{"metadata": {"benchmark_phase": "profiling", "credit_issued_ns": 100}, "metrics": '
    b'{"input_sequence_length": {"value": 5}, "output_sequence_length": {"value": 3}}, '
    b'"error": null}\n{"metadata": {"request_start_ns": 9}, "metrics": {}, "error": {}}\n',
    "csv": b"arrival_ms,prompt_tokens,output_tokens,class\n0,5,3,a\n1.5,7,2,\n",
}
FORMATS = [None, "jsonl", "azure", "burstgpt", "vllm-bench", "guidellm", "aiperf", "csv"]
NASTY = st.sampled_from(
    [
        b"",
        b"\n",
        b"\r\n",
        b",",
        b'"',
        b"{",
        b"}",
        b"[",
        b"-1",
        b"1e999",
        b"NaN",
        b"1.5",
        b"\x00",
        b"\xff",
        b"\xe2\x82",
        b"true",
        b"null",
        b"2023-13-45 25:61:61.1234567",
        b'"hash_ids": [-1]',
        b'"timestamp": "x"',
        b"9" * 400,
        b"9" * 5000,
        b"-" + b"9" * 5000,
        b"[" * 5000,
    ]
)


def outcome(data: bytes, format: str | None, closed_loop: bool = False) -> None:
    """Read ``data``: a trace or a TraceError, and the error message is one line."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.trace"
        path.write_bytes(data)
        try:
            read_trace(path, format, closed_loop=closed_loop)
        except TraceError as error:
            assert "\n" not in str(error)
            assert str(error).startswith(str(path)), str(error)


@settings(max_examples=150)
@given(st.binary(max_size=300), st.sampled_from(FORMATS))
def test_random_bytes(data: bytes, format: str | None) -> None:
    outcome(data, format)


@settings(max_examples=300)
@given(
    st.sampled_from(sorted(SEEDS)),
    st.integers(0, 400),
    st.integers(0, 40),
    st.one_of(NASTY, st.binary(max_size=20)),
    st.sampled_from(FORMATS),
    st.booleans(),
)
def test_mutated_valid_files(
    kind: str, at: int, cut: int, insert: bytes, format: str | None, closed_loop: bool
) -> None:
    seed = SEEDS[kind]
    at = at % (len(seed) + 1)
    outcome(seed[:at] + insert + seed[at + cut :], format, closed_loop)


# Command-line options and storage URLs ------------------------------------------------------
# Garbage for every numeric, text and path option of run, simulate and the trace commands: the
# command either works or ends in one line on stderr with exit code 2, never a traceback.
# (A command line cannot carry NUL, so no value holds one.)
GARBAGE = st.one_of(
    st.sampled_from(
        [
            "",
            " ",
            "-",
            "--help",
            "nan",
            "-nan",
            "inf",
            "-inf",
            "1e999",
            "-1",
            "0",
            "-0",
            "1e-320",
            "0x10",
            "1_000",
            "9" * 30,
            "-" + "9" * 30,
            "abc",
            "1.5",
            "true",
            "=",
            "..",
            "1..",
            "..2",
            "2..1",
            "a=b",
            "{}",
            "[",
            "\\",
            "é",
            "\u202e",
            "1" * 5000,
        ]
    ),
    st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=12),
    st.floats().map(repr),
    st.integers(-(10**30), 10**30).map(str),
)
INPUT_PATHS = st.sampled_from(
    [
        "",
        ".",
        "/",
        "/nonexistent/x",
        "a" * 300,
        "~",
        "/etc/passwd",
        "/proc/self/status",
        "/dev/null",
    ]
)
OUTPUT_NAMES = st.one_of(
    st.sampled_from(["", ".", "..", "a" * 300, "nodir/x", "sub", "link", "fifo", "ok.jsonl"]),
    st.text(
        st.characters(blacklist_characters="\x00/", blacklist_categories=("Cs",)),
        min_size=1,
        max_size=12,
    ),
)
FUZZ_SETTINGS = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "60")),
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def one_line_or_success(result: tuple[int, str, str]) -> None:
    code, out, err = result
    assert "Traceback" not in out + err, err[-2000:]
    assert code in (0, 2), (code, err[-2000:])
    if code == 2:
        assert err.startswith("error: ") and err.count("\n") == 1, err[-2000:]


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder with the kinds of things an output path may name."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "target").write_text("keep\n")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    os.mkfifo(tmp_path / "fifo")
    return tmp_path


RUN_NUMBERS = [
    "--trials",
    "--timeout",
    "--seed",
    "--error-budget",
    "--capacity-tolerance",
    "--start",
    "--duration",
    "--rate-scale",
    "--max-requests",
    "--dequantize",
    "--jitter-seed",
    "--hang-timeout",
    "--format",
    "--objective",
    "--sampler",
    "--engine",
    "--over-length",
]
ASSIGNMENTS = {
    "--set": ["max_num_seqs", "max_model_len", "enable_chunked_prefill", "watermark", "bogus"],
    "--space": ["max_num_batched_tokens", "enable_chunked_prefill", "long_prefill_token_threshold"],
    "--slo": ["p99_tpot", "p95_ttft", "p50_e2e"],
}


@pytest.mark.slow
@FUZZ_SETTINGS
@given(
    st.one_of(
        st.tuples(st.sampled_from(RUN_NUMBERS), GARBAGE),
        st.tuples(st.sampled_from(["--trace", "--space-file", "--profile"]), INPUT_PATHS),
        st.tuples(
            st.sampled_from(sorted(ASSIGNMENTS)).flatmap(
                lambda flag: st.tuples(st.just(flag), st.sampled_from(ASSIGNMENTS[flag]))
            ),
            GARBAGE,
        ).map(lambda drawn: (drawn[0][0], f"{drawn[0][1]}={drawn[1]}")),
    )
)
def test_run_options(tune, workdir: Path, option: tuple[str, str]) -> None:
    flag, value = option
    fixed = {
        "--trace": str(AZURE),
        "--max-requests": "5",
        "--trials": "1",
        "--timeout": "5",
        "--slo": "p99_tpot=50ms",
    }
    fixed[flag] = value
    args = [f"{name}={text}" for name, text in fixed.items()]
    if flag == "--trials":
        args.append("--timeout=2")  # a huge valid count stops in time
    if flag == "--over-length":
        args = [arg for arg in args if arg != f"--over-length={value}"]  # run has no such flag
    database = workdir / "fuzz.db"
    one_line_or_success(tune("run", *args, f"--storage=sqlite:///{database}", "--study=fuzz"))
    database.unlink(missing_ok=True)


SIM_FLAGS = [
    "--max-num-batched-tokens",
    "--max-num-seqs",
    "--max-model-len",
    "--long-prefill-token-threshold",
    "--watermark",
    "--block-size",
    "--num-gpu-blocks",
    "--kv-cache-memory-bytes",
    "--over-length",
    "--rate-scale",
    "--max-requests",
    "--dequantize",
]


@pytest.mark.slow
@FUZZ_SETTINGS
@given(
    st.one_of(
        st.tuples(st.sampled_from(SIM_FLAGS), GARBAGE),
        st.tuples(st.sampled_from(["--trace", "--profile"]), INPUT_PATHS),
        st.tuples(st.just("--steps-out"), OUTPUT_NAMES),
    )
)
def test_simulate_options(tune, workdir: Path, option: tuple[str, str]) -> None:
    flag, value = option
    fixed = {"--trace": str(AZURE), "--max-requests": "5", flag: value}
    one_line_or_success(tune("simulate", *(f"{name}={text}" for name, text in fixed.items())))
    assert (workdir / "target").read_text() == "keep\n"


@FUZZ_SETTINGS
@given(
    st.one_of(
        st.tuples(st.sampled_from(["--from-study", "--name", "--spacing", "--storage"]), GARBAGE),
        st.tuples(st.just("-o"), OUTPUT_NAMES),
    )
)
def test_calibrate_options(tune, workdir: Path, option: tuple[str, str]) -> None:
    """``tune calibrate --from-study`` (no server) on a storage that has no such study."""
    flag, value = option
    fixed = {"--from-study": "nope", "--storage": "sqlite:///empty.db", "-o": "p.yaml", flag: value}
    (workdir / "empty.db").touch()
    one_line_or_success(tune("calibrate", *(f"{name}={text}" for name, text in fixed.items())))
    assert (workdir / "target").read_text() == "keep\n"


TRACE_FLAGS = [
    "--start",
    "--duration",
    "--rate-scale",
    "--max-requests",
    "--dequantize",
    "--jitter-seed",
    "--max-model-len",
    "--over-length",
    "--format",
]
SYNTH_FLAGS = [
    "--mix",
    "--rate",
    "--duration",
    "--count",
    "--arrivals",
    "--cv",
    "--burst",
    "--seed",
]


@FUZZ_SETTINGS
@given(
    st.sampled_from(["stats", "convert", "synth"]),
    st.one_of(
        st.tuples(st.sampled_from(TRACE_FLAGS + SYNTH_FLAGS), GARBAGE),
        st.tuples(st.just("FILE"), INPUT_PATHS),
        st.tuples(st.just("TARGET"), OUTPUT_NAMES),
    ),
)
def test_trace_options(tune, workdir: Path, command: str, option: tuple[str, str]) -> None:
    flag, value = option
    source = value if flag == "FILE" else str(AZURE)
    target = value if flag == "TARGET" else "out.jsonl"
    if command == "synth":
        fixed = {"--count": "10", "--duration": "10", "--rate": "1"}
        positional = [target]
    else:
        fixed = {"--max-requests": "5"}
        positional = [source, target] if command == "convert" else [source]
    if flag in (SYNTH_FLAGS if command == "synth" else TRACE_FLAGS):
        fixed[flag] = value
    elif flag.startswith("--"):
        return  # not an option of this command
    args = [*positional, *(f"{name}={text}" for name, text in fixed.items())]
    one_line_or_success(tune("trace", command, *args))
    assert (workdir / "target").read_text() == "keep\n"
    assert (workdir / "link").is_symlink() and (workdir / "fifo").is_fifo()


CANARY = "CANARYpw"
SCHEMES = st.sampled_from(
    [
        "sqlite",
        "sqlite+pysqlite",
        "postgresql",
        "postgresql+psycopg",
        "postgresql+psycopg2",
        "postgresql+asyncpg",
        "mysql",
        "mysql+pymysql",
        "oracle",
        "http",
        "",
        "SQLITE",
    ]
)
URL_TEXT = st.text(
    st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=10
)
# Hosts stay on this machine: a random host name would be looked up in the DNS.
HOSTS = st.sampled_from(["127.0.0.1", "127.0.0.1:1", "127.0.0.1:abc", "127.0.0.1:99999", "[::1]"])


@st.composite
def storage_urls(draw: st.DrawFn) -> str:
    scheme = draw(SCHEMES)
    user = draw(st.sampled_from(["u", "postgres", ""]) | URL_TEXT.filter(lambda t: "@" not in t))
    password = CANARY + draw(st.sampled_from(["", "@x", ":y", "/z", "%40", "?q"]))
    if scheme.lower().startswith("sqlite"):
        return f"{scheme}:///{draw(URL_TEXT.filter(lambda t: '/' not in t))}"
    host = draw(HOSTS)
    database = draw(st.sampled_from(["test", "nope", ""]) | URL_TEXT)
    query = draw(st.sampled_from(["", f"?password={CANARY}", "?connect_timeout=2", "?x"]))
    return f"{scheme}://{user}:{password}@{host}/{database}{query}"


@FUZZ_SETTINGS
@given(
    st.one_of(
        storage_urls(),
        st.tuples(URL_TEXT, URL_TEXT).map(lambda t: f"{t[0]}u:{CANARY}@{t[1]}"),
    )
)
def test_storage_urls(tune, workdir: Path, url: str) -> None:
    code, out, err = tune("pareto", f"--storage={url}", "--study=fuzz")
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in out + err
    assert CANARY not in out + err
