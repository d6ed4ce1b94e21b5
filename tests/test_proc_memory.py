"""experiments/proc_memory.py on this process (Linux /proc)."""

import math
import mmap
import os

import pytest

from experiments import proc_memory

linux = pytest.mark.skipif(
    not os.path.exists("/proc/self/status"), reason="needs Linux /proc"
)


@linux
def test_fields_and_missing_field():
  rss = proc_memory.proc_status_kb("VmRSS")
  assert 1_000 < rss < 100_000_000  # kB: more than 1 MB, less than 100 GB
  assert proc_memory.proc_status_kb("VmHWM") >= rss
  assert math.isnan(proc_memory.proc_status_kb("NoSuchField"))


@linux
def test_reset_hwm_lowers_the_peak_to_the_current_rss():
  if not proc_memory.reset_hwm():
    pytest.skip("the kernel refuses clear_refs here")
  # 200 MiB mapped and touched, then unmapped: the RSS drops, the peak not
  # (an mmap directly, so the allocator's keep-memory policy does not apply).
  block = mmap.mmap(-1, 200 * 2**20)
  for i in range(0, len(block), 4096):
    block[i] = 1
  block.close()
  before = proc_memory.proc_status_kb("VmHWM")
  assert proc_memory.reset_hwm()
  after = proc_memory.proc_status_kb("VmHWM")
  rss = proc_memory.proc_status_kb("VmRSS")
  assert before - after > 150 * 1024  # the 200 MiB peak is gone
  assert after <= rss + 10 * 1024
