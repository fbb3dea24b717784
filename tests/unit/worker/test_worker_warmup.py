"""Start-up costs are paid when a worker starts: afterwards the first optimizer costs no import."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys, time
import torch
from worker.warmup import warm_up
assert "torch._dynamo" not in sys.modules
warm_up()
assert "torch._dynamo" in sys.modules
from multiprocessing import forkserver
assert forkserver._forkserver._forkserver_pid is not None  # the accountants' server is up
from kernel.privacy import PoissonSampledGaussianEvent
from kernel.privacy.single_job import capped_single_job_epsilon
event = PoissonSampledGaussianEvent(sampling_probability=0.05, noise_multiplier=1.0, count=20)
assert capped_single_job_epsilon(event, 1e-6, zcdp_is_gaussian=True).method == "prv"
import worker.entry  # the Celery entry point registers warm_up for worker start
from celery.signals import worker_init
assert any(getattr(r(), "__name__", "") == "_warm_up" for _, r in worker_init.receivers), worker_init.receivers
print("ok")
"""


def test_warm_up_imports_what_the_first_optimizer_would() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("ok")
