#!/usr/bin/env bash
# tune-nightly.sh STUDY [tune nightly options]
#
# Retunes STUDY on yesterday's trace, $TUNE_TRACE_DIR/STUDY/YYYY-MM-DD.jsonl, and turns the
# exit code of `tune nightly` into one that cron, systemd and Kubernetes understand:
#   0    incumbent kept                   -> exit 0
#   3    new configuration promoted       -> run $TUNE_ON_PROMOTE, exit $TUNE_PROMOTED_EXIT (0);
#                                            exit 5 if the hook fails
#   4    no configuration meets the SLOs  -> run $TUNE_ON_ALERT, exit 4
#   else 1 error, 2 bad input (or no trace), 130 interrupted -> run $TUNE_ON_ALERT, same code
# Hooks are shell commands; they see TUNE_EXIT, TUNE_STUDY, TUNE_DAY and TUNE_OUT (the study's
# report folder, with serve.sh, serve.yaml and the dated reports).
# TUNE_STORAGE and HF_TOKEN come from the environment, never from a command line.
set -euo pipefail

study=${1:?usage: tune-nightly.sh STUDY [tune nightly options]}
shift
day=${TUNE_DAY:-$(date -d yesterday +%F)}
trace=${TUNE_TRACE_DIR:-/var/lib/tune/traces}/$study/$day.jsonl
report_dir=${TUNE_REPORT_DIR:-/var/lib/tune/reports}
export TUNE_STUDY=$study TUNE_DAY=$day TUNE_OUT=$report_dir/$study

hook() { [[ -z $1 ]] || bash -c "$1"; }

if [[ ! -s $trace ]]; then
    echo "tune-nightly: no trace for $day: $trace" >&2
    rc=2
else
    # A stop (SIGTERM from systemd or Kubernetes) or Ctrl-C reaches tune as SIGINT: it stops
    # its trial and server, keeps what is finished and exits 130. The trap is set before tune
    # starts: set after, a stop in between killed this script and left tune running. set -m:
    # bash would otherwise start tune with SIGINT ignored.
    interrupted=
    child=
    trap 'interrupted=1; if [[ -n $child ]]; then kill -INT "$child" 2>/dev/null || true; fi' \
        TERM INT
    set -m
    # The server logs of a real engine's trials: only where a folder is given (the simulator
    # starts no server, and refuses --log-dir).
    logs=()
    [[ -z ${TUNE_LOG_DIR:-} ]] || logs=(--log-dir "$TUNE_LOG_DIR/$study")
    tune nightly --study "$study" --trace "$trace" --report-dir "$report_dir" "${logs[@]}" "$@" &
    child=$!
    rc=0
    [[ -n $interrupted ]] || wait "$child" || rc=$?
    if [[ -n $interrupted ]]; then
        # The stop may have ended the wait early, or come before it. Passed on between the
        # fork and tune's start, it is lost (the child still runs this script's trap then):
        # say it until tune has ended (tune ignores repeats while it cleans up). Then its exit
        # code, unless the wait above had it already (a second wait says 127).
        while kill -0 "$child" 2>/dev/null; do
            kill -INT "$child" 2>/dev/null || true
            sleep 0.5
        done
        status=0
        wait "$child" || status=$?
        [[ $status == 127 ]] || rc=$status
    fi
fi

export TUNE_EXIT=$rc
case $rc in
    0)
        echo "tune-nightly: $study: incumbent kept"
        ;;
    3)
        echo "tune-nightly: $study: new configuration promoted: $TUNE_OUT/serve.yaml"
        hook "${TUNE_ON_PROMOTE:-}" || { echo "tune-nightly: rollout hook failed" >&2; exit 5; }
        exit "${TUNE_PROMOTED_EXIT:-0}"
        ;;
    *)
        [[ $rc != 4 ]] || echo "tune-nightly: $study: no configuration meets the SLOs" >&2
        hook "${TUNE_ON_ALERT:-}" || echo "tune-nightly: alert hook failed" >&2
        exit "$rc"
        ;;
esac
