"""The embedded executor: run a plan for real on torch.distributed and check it against one process.

One module per step (docs/style.md):
  runspec.py      plan document -> `RunSpec` (model shape, parallel config, proxy shrink, notes)
  parallelize.py  small `apply_*` functions on a plain `Transformer` (mesh, TP, AC, DDP/FSDP2/HSDP, pipeline)
  context.py      context parallelism: load-balanced sequence split, ring / all-gather / Ulysses attention
  experts.py      expert parallelism: expert groups, all-to-all token dispatch and combine
  worker.py       one rank: mesh, model, parallelism, training steps, timings, results
  launch.py       spawn world-size local processes and watch them (faults.py: heartbeats, kill,
                  planted test bugs; lifecycle.py: signals, ranks that die with their launcher)
  checkpoint.py   torch.distributed.checkpoint save/resume, manifests, fallback to an intact step
  record.py       what a run records for --verify (per-step gradients, sampled parameters)
  reference.py    the single-process reference anchored at the run, and the rounding bounds
  verify.py       check every step of a run against one process (loss, gradients, parameters)
Nothing in the model knows it runs in parallel (torchtitan's split of model and parallelize); the
model only takes the token positions a context-parallel rank holds (`Transformer.positions`).
"""

from __future__ import annotations

from planner.errors import PlannerError


class ExecutorError(PlannerError):
    """A run that started but failed (a rank died, hung, or verification failed): exit 1."""

    exit_code = 1
