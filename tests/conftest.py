"""Markers and fixtures the test files share."""

import os
import sys
import time

import pytest

REFERENCE_YARDSTICK_CPU_S = 0.182
"""CPU seconds of the yardstick search (the README's GPT-3 175B command: 960 A100s, global batch 1536) on the
2-core machine where the search budgets were set: 0.182 s in benchmarks/results/search_speed.json at commit
cce5254, the same run that measured DeepSeek-V3's search at 1.36 s against its 2 s budget."""


def pytest_addoption(parser):
    parser.addoption(
        "--slow",
        action="store_true",
        help="also run the tests marked slow (real-size executor runs, the frameworks' own "
        "validators, signals and hung ranks): README.md, 'The slow tier'",
    )


def pytest_collection_modifyitems(config, items):
    """The default run leaves out the tests marked slow (the suite stays under five minutes on two
    idle cores); `--slow` runs them too, and `-m slow --slow` runs only them."""
    if config.getoption("--slow"):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "speed: checks a time budget of the search (acceptance timings measured on "
        "2 idle cores); `-m 'not speed'` skips them on a loaded machine",
    )
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _one_thread_per_worker()


def _one_thread_per_worker() -> None:
    """`pytest -n auto` runs one worker per core: torch's intra-op pool in each (one thread per core
    by default) would contend with the other workers' for the same cores, so a worker's in-process
    torch runs one thread (executor ranks and calibrations set their own counts)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


@pytest.fixture
def machine_slowdown():
    """How much slower this machine runs the search than the one the budgets were set on (at least 1): the
    yardstick search's best CPU time of three over REFERENCE_YARDSTICK_CPU_S, measured just before the test so
    that both run under the same load. A budget times this factor holds a search to the same share of work on a
    slower CI machine; a search that regresses alone (not the yardstick) still fails it, and the yardstick keeps
    its own figure in benchmarks/search_speed.py."""
    _yardstick_cpu_s()  # imports and caches paid here
    best = min(_yardstick_cpu_s() for _ in range(3))
    return max(1.0, best / REFERENCE_YARDSTICK_CPU_S)


def _yardstick_cpu_s() -> float:
    from planner.search import recommend

    t0 = time.process_time()
    recommend("gpt3-175b", "p4d.24xlarge", gpus=960, global_batch=1536)
    return time.process_time() - t0


def interleaved_cpu_s(search, rounds: int = 3) -> tuple[float, float]:
    """(the search's best CPU seconds, machine_slowdown), the yardstick and the search run in turn `rounds` times,
    each after a garbage collection: a budget times that slowdown holds the search to the same share of work as
    the fixture does, measured under the same load (a load that comes and goes between a fixture's yardstick and
    the test's runs would otherwise count against the search alone). The search's first run (its caches) and the
    yardstick's warm-up happen before."""
    import gc

    search()
    _yardstick_cpu_s()
    yard = cpu = float("inf")
    for _ in range(rounds):
        gc.collect()
        yard = min(yard, _yardstick_cpu_s())
        gc.collect()
        t0 = time.process_time()
        search()
        cpu = min(cpu, time.process_time() - t0)
    return cpu, max(1.0, yard / REFERENCE_YARDSTICK_CPU_S)
