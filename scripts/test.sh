#!/usr/bin/env bash
# Set up (if needed), lint, build the docs site (--strict), then run the whole test suite: unit tests,
# then integration tests that start real vLLM servers. Extra arguments go to pytest alone (e.g.
# `bash scripts/test.sh tests/unit -x`). `--fast`: the lane a change needs, in under 2 minutes: the tests
# marked neither integration, slow, vllm nor gpu (pyproject's markers), without lint or the docs.
#
# Tests that start neither vLLM nor an `rl` run (the fast lane, and the slow tests that train a tiny
# model or start a CLI) run on one pytest-xdist worker per core, one torch thread each: they are small
# and mostly single-threaded, so two workers of one thread did the fast lane of a 2-core machine in
# 2:01 where one worker of two threads took 3:12, and two workers of two threads 5:16 (the threads
# fight). The integration tests start vLLM, torchrun and rl, which place their own threads on every
# core: they run one at a time, after the others.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 WANDB_MODE=disabled RAY_AUTH_MODE=disabled TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
FAST="not integration and not slow and not vllm and not gpu"
ALONE="not integration and not vllm and not gpu"  # no vLLM, no rl run: on every core at once
on_every_core() { OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests -n auto "$@"; }
if [[ "${1:-}" == "--fast" ]]; then
    shift
    on_every_core -q -m "$FAST" --durations=10 "$@"
    exit
fi
if [[ $# -gt 0 ]]; then
    exec .venv/bin/python -m pytest "$@"
fi
.venv/bin/ruff check src tests scripts benchmarks
.venv/bin/ruff format --check src tests scripts benchmarks
.venv/bin/mypy src scripts benchmarks
# The docs site (mkdocs.yml): --strict fails on a broken link, a missing page or an API docstring
# mkdocstrings cannot render. Built outside the repository and removed.
site=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$site"
rm -rf "$site"
# The tests that start no vLLM first (a broken change shows within minutes), then the others; both run
# whatever the first found, and the exit status is a failure if either failed.
status=0
on_every_core -v -m "$ALONE" --durations=15 || status=$?
# Every integration test of 10 s or more, with its time: where the lane's minutes go.
.venv/bin/python -m pytest tests -v -m "not ($ALONE)" --durations=0 --durations-min=10 || status=$?
exit $status
