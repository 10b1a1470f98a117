"""XXH64 (cpprb_ray._digest), the checksum of a checkpoint's payload: the reference
implementation's values for every path through the hash (inputs shorter than a 32-byte stripe,
whole stripes, each tail length), the same value for any split into updates, and buffers of any
contiguous kind.

The expected values were computed with the xxhash package (the reference C implementation's
binding), which the tests do not need.
"""

from __future__ import annotations

import numpy as np
import pytest

from cpprb_ray._digest import Digest, xxh64

SEED = 2**64 - 1

# length: (XXH64 with seed 0, with seed 2**64 - 1) of bytes((7 * i + 3) % 256 for i in range(n))
REFERENCE = {
    1: (0x1F25C8D0BC1F4BB6, 0x7B75C7A6356B0B4D),
    3: (0x31D2363F52E564C9, 0xE422054A9BC43A06),
    4: (0x9BB64B7D66EE9FDA, 0x1C1305B583B5E78C),
    7: (0x9A7B149959CE60D8, 0x76C17F70933C79ED),
    8: (0xDAB99D95C6F90092, 0x91981F79E1F7D960),
    12: (0xD52E407833AF5133, 0x24D935BE81C72AB6),
    31: (0xA2AA5F33CC4A6119, 0x931DF7FF3B1D1E4A),
    32: (0x23C3C17EF790FD97, 0x2CD9B29BF8EED6BF),
    33: (0x50A7CFC7BA588784, 0xDBBAC9766BB3ADF7),
    35: (0xA5B3456011D2913B, 0x8E5A6ED09BED0D80),
    63: (0x5E3E54B431C7493C, 0x4DC01BDAFE25FCBC),
    64: (0x0EB64B3EF6EEB01F, 0xE90717D28B13C3E9),
    100: (0xA61F8D4C170FE531, 0x7D5CA39DFCFBEACA),
    1000: (0x5F235FA033F1A3FB, 0x75A57189C6551B25),
}


def data(length: int) -> bytes:
    return bytes((7 * i + 3) % 256 for i in range(length))


@pytest.mark.parametrize("length", sorted(REFERENCE))
def test_the_reference_values(length):
    plain, seeded = REFERENCE[length]
    assert xxh64(data(length)) == plain
    assert xxh64(data(length), SEED) == seeded


def test_well_known_values():
    assert xxh64(b"") == 0xEF46DB3751D8E999
    assert xxh64(b"abc") == 0x44BC2CF5AD770999
    assert xxh64(b"The quick brown fox jumps over the lazy dog") == 0x0B242D361FDA71BC
    assert xxh64(bytes(range(256)) * 3) == 0x8E03C838C596036F


def test_any_split_gives_the_one_shot_value():
    random = np.random.default_rng(5)
    for length in list(range(0, 80)) + [1000, 4099]:
        whole = random.bytes(length)
        expected = xxh64(whole)
        for _ in range(20):
            cuts = np.sort(random.integers(0, length + 1, size=random.integers(0, 6)))
            digest = Digest()
            start = 0
            for cut in list(cuts) + [length]:
                digest.update(whole[start:cut])
                start = cut
            assert digest.intdigest() == expected, (length, list(cuts))
        digest = Digest()
        digest.update(whole)
        assert digest.intdigest() == digest.intdigest() == expected   # reading does not change it


def test_buffers_of_any_contiguous_kind():
    array = np.arange(1000, dtype=np.float64)
    expected = xxh64(array.tobytes())
    assert xxh64(array) == xxh64(memoryview(array)) == xxh64(bytearray(array.tobytes())) \
        == expected
    assert xxh64(array.reshape(10, 100)) == expected
    with pytest.raises((BufferError, ValueError)):   # what the exporter says: numpy ValueError
        xxh64(array[::2])
    with pytest.raises(TypeError):
        xxh64("text")
