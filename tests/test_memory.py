import sys

import numpy as np
import pytest

from lightning_nsv.memory import ADVISED_BYTES_MIN, base_page_empty


def _vm_flags(address: int) -> list[str]:
    """The ``VmFlags`` of the mapping of this process that holds ``address`` (Linux ``/proc/self/smaps``)."""
    inside, flags = False, None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(part, 16) for part in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "VmFlags:":
                flags = line.split()[1:]
                break
    assert flags is not None, "no mapping holds the array"
    return flags


@pytest.mark.parametrize("shape", [(3, 4), (1 << 20,), (600, 4000)])
def test_base_page_empty_is_an_owned_c_ordered_float64_array(shape):
    array = base_page_empty(shape)
    assert array.shape == shape and array.dtype == np.float64
    assert array.flags.c_contiguous and array.flags.owndata
    array.fill(2.0)
    assert float(array.sum()) == 2.0 * array.size
    array.resize((shape[0] // 2,) + shape[1:])  # the column store shrinks such arrays in place
    assert array.shape[0] == shape[0] // 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise advice is read back from /proc")
def test_large_arrays_ask_for_base_pages():
    large = base_page_empty((ADVISED_BYTES_MIN // 8 + 4096,))
    assert "nh" in _vm_flags(large.ctypes.data + large.nbytes // 2)  # MADV_NOHUGEPAGE on its pages
    plain = np.empty(ADVISED_BYTES_MIN // 8 + 4096)
    assert "nh" not in _vm_flags(plain.ctypes.data + plain.nbytes // 2)
