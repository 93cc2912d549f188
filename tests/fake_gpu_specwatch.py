"""`specwatch run` with NVML answered by tests/fake_pynvml.py: two H200s (one power-capped),
and XID 79 raised on GPU 0 once the sampler listens. The rest of the daemon is the real one;
this lets a GPU-less machine export every specwatch_gpu_* family (for the dashboard tests).

usage: python tests/fake_gpu_specwatch.py run --config FILE
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fake_pynvml  # noqa: E402
from specwatch import cli  # noqa: E402
from specwatch.sources import nvml  # noqa: E402

fake = fake_pynvml.FakeNvml(fake_pynvml.two_h200s())
fake.devices[0].clock_event_reasons = fake.nvmlClocksEventReasonSwPowerCap
_init = nvml.GpuSampler.__init__


def _with_fake(self, nvml_module=None, **kwargs):
    _init(self, fake, **kwargs)


def _raise_xid():
    deadline = time.monotonic() + 30
    while not fake.initialised and time.monotonic() < deadline:
        time.sleep(0.05)
    fake.push_xid(0, 79)


nvml.GpuSampler.__init__ = _with_fake
threading.Thread(target=_raise_xid, daemon=True).start()
sys.exit(cli.main(sys.argv[1:]))
