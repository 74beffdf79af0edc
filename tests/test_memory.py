"""--malloc: what keep changes, measured in page faults, and that a bad value is refused."""
import subprocess
import sys

import pytest

from enspipe.run.config import RunConfig
from enspipe.plan.errors import ConfigError

FAULTS = """
import ctypes, ctypes.util, resource, sys
from enspipe.engine.memory import set_malloc
print(set_malloc(sys.argv[1]))
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, (ctypes.c_size_t,), (ctypes.c_void_p,)

def batch(size):  # as TensorFlow makes a tensor: malloc, written, freed
    p = libc.malloc(size)
    ctypes.memset(p, 1, size)
    libc.free(p)

batch(10 << 20)  # 10 MiB: glibc raises its mmap threshold once such a block is freed ...
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):  # ... to 32 MiB at most: a batch of 64 float32 224 px images (37 MiB) stays above it
    batch(37 << 20)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

def faults(policy: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", FAULTS, policy], capture_output=True, text=True, check=True)
    in_force, count = out.stdout.split()
    return in_force, int(count)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_keep_reuses_freed_batches_pages_where_the_system_malloc_faults_them_in_afresh():
    pages = (37 << 20) // 4096  # one batch's pages
    in_force_system, system = faults("system")
    in_force, keep = faults("keep")
    assert in_force_system == "system" and in_force == "keep"
    assert keep < 2 * pages  # the first batch's pages, then reused
    assert system > 10 * keep  # every batch mapped and faulted in again (20 x its pages, or its huge pages)


def test_an_unknown_malloc_policy_is_refused_naming_the_option():
    with pytest.raises(ConfigError) as e:
        RunConfig.of(data=".", out="o", malloc="tcmalloc")
    assert e.value.field == "malloc" and "keep" in str(e.value)
