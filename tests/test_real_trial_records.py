"""What a real trial leaves behind, without starting vLLM: log names that are never reused,
failure causes from the log and from vLLM's validators, non-plain config values kept as text,
and failed trials reported as failed."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from types import ModuleType

import pydantic

from prefill_tuner.cli.display import trial_line
from prefill_tuner.engines.real.engine import new_log_path
from prefill_tuner.engines.real.launcher import classify_failure, failure_cause
from prefill_tuner.engines.real.resolver import VLLM_ARGS, error_line
from prefill_tuner.objectives.scoring import Objective, Verdict
from prefill_tuner.study.run import TrialResult

ENGINE_DEAD_LOG = """\
(APIServer pid=1) INFO 11-30 21:53:52 [api_server.py:1] vLLM API server version 0.32.0
(APIServer pid=1) WARNING 11-30 21:53:52 [base.py:380] ValueError: Tokenizer not available
(EngineCore pid=2) ERROR 11-30 21:53:56 [core.py:9] EngineCore encountered a fatal error.
(EngineCore pid=2) ERROR 11-30 21:53:56 [core.py:9] Traceback (most recent call last):
(EngineCore pid=2) ERROR 11-30 21:53:56 [core.py:9]   File "core.py", line 9, in run
(EngineCore pid=2) ERROR 11-30 21:53:56 [core.py:9] RuntimeError: bad things in the kernel
(APIServer pid=1) ERROR 11-30 21:53:56 [async_llm.py:906] AsyncLLM output_handler failed.
(APIServer pid=1) ERROR 11-30 21:53:56 [async_llm.py:906] vllm.v1.engine.exceptions.\
EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
/usr/lib/python3.11/multiprocessing/resource_tracker.py:123: UserWarning: resource_tracker
KeyError: '/psm_6a8bd749'
INFO:     127.0.0.1:45926 - "GET /health HTTP/1.1" 503 Service Unavailable
"""


def test_log_names_are_never_reused(tmp_path: Path) -> None:
    first = new_log_path(tmp_path, "study-trial-0003")
    first.write_text("trial 3's log")
    again = new_log_path(tmp_path, "study-trial-0003")  # a resumed study, a retried trial
    assert first.name == "study-trial-0003.log" and again.name == "study-trial-0003-2.log"
    assert first.read_text() == "trial 3's log" and again.exists()
    stray = tmp_path / "study-trial-0004.steps.jsonl"
    stray.write_text("{}")  # a step trace whose log was deleted still holds the name
    assert new_log_path(tmp_path, "study-trial-0004").name == "study-trial-0004-2.log"
    assert new_log_path(tmp_path, "../x/y").parent == tmp_path  # labels cannot escape


def test_a_dead_engine_core_is_the_cause_not_the_503(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text(ENGINE_DEAD_LOG)
    assert failure_cause(log) == "EngineDeadError: RuntimeError: bad things in the kernel"
    assert classify_failure(log, 1) == (
        "exited with code 1: EngineDeadError: RuntimeError: bad things in the kernel"
    )
    log.write_text(
        "(APIServer pid=1) WARNING 11-30 21:53:56 [core_client.py:817] [shutdown] MPClient: engine "
        "core exited unexpectedly; starting cleanup\n"
        "(APIServer pid=1) ERROR 11-30 21:53:56 [a.py:9] vllm.v1.engine.exceptions."
        "EngineDeadError: EngineCore encountered an issue.\n"
    )
    assert failure_cause(log) == (
        "EngineDeadError: MPClient: engine core exited unexpectedly; starting cleanup"
    )
    log.write_text("(APIServer pid=1) INFO 11-30 21:53:52 [a.py:1] all well\n")
    assert failure_cause(log) is None


def _vllm_args() -> ModuleType:
    """``vllm_args.py`` imports no vLLM at module level: its helpers can be tested here."""
    spec = importlib.util.spec_from_file_location("vllm_args_under_test", VLLM_ARGS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Dtype:
    """Stands for ``torch.float32``: not JSON, not callable."""

    def __str__(self) -> str:
        return "torch.float32"


def test_resolved_configs_keep_non_plain_values_as_text() -> None:
    @dataclasses.dataclass
    class Nested:
        x: int = 1

    @dataclasses.dataclass
    class ModelConfig:
        dtype: object = dataclasses.field(default_factory=_Dtype)
        max_model_len: int = 2048
        hf_token: str = "hf_secret"
        tags: tuple[str, ...] = ("a", "b")
        nested: Nested = dataclasses.field(default_factory=Nested)

    assert _vllm_args()._plain_fields(ModelConfig()) == {
        "dtype": "torch.float32",
        "max_model_len": 2048,
        "tags": ["a", "b"],
    }


def test_a_rejection_keeps_the_validators_own_words() -> None:
    class SchedulerConfig(pydantic.BaseModel):
        max_num_seqs: int = 128
        max_num_active_seqs: int = 200

        @pydantic.model_validator(mode="after")
        def _check(self) -> SchedulerConfig:
            raise ValueError(
                f"max_num_active_seqs ({self.max_num_active_seqs}) cannot be greater than "
                f"max_num_seqs ({self.max_num_seqs})"
            )

    try:
        SchedulerConfig()
    except pydantic.ValidationError as exc:
        text = _vllm_args()._error_text(exc)
    assert text == "max_num_active_seqs (200) cannot be greater than max_num_seqs (128)"
    # What the engine stores: vllm_args.py's one line, without its "error: ".
    assert error_line(f"a warning\nerror: {text}\n") == text


def test_a_failed_trial_is_shown_as_failed_not_by_its_penalties() -> None:
    verdict = Verdict(constraints={"p99_tpot": 1000.0, "errors": 1.0}, slacks={"p99_tpot": -1000})
    objectives = [Objective("p99_ttft", "minimize"), Objective("p99_tpot", "minimize")]
    failed = TrialResult(
        3, {}, [3600.0, 3600.0], verdict, "the server hung", False, log_path="logs/s-3.log"
    )
    assert trial_line(failed, objectives) == ("trial 3 failed: the server hung (log: logs/s-3.log)")
    met = Verdict(constraints={"p99_tpot": -0.5, "errors": 0.0}, slacks={"p99_tpot": 0.5})
    assert trial_line(TrialResult(4, {}, [0.2, 0.01], met, None, False), objectives) == (
        "trial 4 meets the SLOs: p99_ttft 200ms, p99_tpot 10ms"
    )
