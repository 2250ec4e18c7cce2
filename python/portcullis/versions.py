"""The version envelope of records and checkpoints (SPEC E7), the same bytes as the Rust
`typed` module writes (docs/SCHEMA.md): the version in 7-bit groups from the lowest, each in a
byte with its top bit set, then a zero byte, then the machine's own bytes. Version 1 is
`b"\\x81\\x00"`: two bytes below version 128.

Owns: `envelope`, `split_version`, `UNENVELOPED_VERSION` and `VERSION_CODE`. A machine with a
`version` (see `StateMachine`) has every record and checkpoint it writes put behind an
envelope by the bridge, and reads older versions through its upcast methods.

Bytes that do not start with one to five bytes of 0x80 or more followed by a zero byte carry
no envelope and are version 1: what the machine wrote before it had a version. Such bytes are
taken for an envelope only if they start that way; text (UTF-8 never starts with such a run
followed by a zero byte unless it holds a NUL right after a multi-byte character), JSON and
pickle never do, but raw little-endian integers can (129 as 8 bytes is `81 00 ...`): read
docs/SCHEMA.md before giving a machine with such records a version.
"""

from . import _lib
from .errors import Refused

#: The version of bytes without an envelope.
UNENVELOPED_VERSION = 1

#: The refusal code the bridge answers for bytes of a version the machine does not read: the
#: C library's `PC_VERSION_REFUSED`, which a C machine's refusals carry too.
VERSION_CODE = _lib.VERSION_REFUSED

_MAX_HEADER = 6
_MAX_VERSION = 2**32 - 1


def envelope(version, payload):
    """`payload` (bytes) behind the envelope of `version` (an int from 1 to 2**32 - 1)."""
    if not isinstance(version, int) or isinstance(version, bool) or not 0 < version <= _MAX_VERSION:
        raise ValueError("a version is an integer from 1 to 2**32 - 1")
    out = bytearray()
    rest = version
    while True:
        out.append(0x80 | (rest & 0x7F))
        rest >>= 7
        if rest == 0:
            break
    out.append(0)
    return bytes(out) + payload


def split_version(data):
    """`(version, payload, enveloped)` of stored bytes; without an envelope `(1, data, False)`.
    Raises `Refused` (code `VERSION_CODE`) for an envelope naming version 0 or one beyond 32
    bits: no code writes those."""
    version = 0
    for i, byte in enumerate(data[:_MAX_HEADER]):
        if byte & 0x80 == 0:
            if i == 0 or byte != 0:
                break
            if not 0 < version <= _MAX_VERSION:
                raise Refused(
                    f"its version envelope names version {version}, which no code writes",
                    VERSION_CODE,
                )
            return version, data[i + 1 :], True
        version |= (byte & 0x7F) << (7 * i)
    return UNENVELOPED_VERSION, data, False


def newer(what, version, current):
    """The refusal of bytes written by a newer version than the machine's."""
    return Refused(
        f"the {what} was written by version {version}, newer than this machine's version "
        f"{current}: only code that knows version {version} reads it",
        VERSION_CODE,
    )


def no_upcast(what, hook, version, current):
    """The refusal of the default upcast methods."""
    return Refused(
        f"the {what} was written by version {version} and this machine is version {current}: "
        f"its {hook} does not bring version {version} up (docs/SCHEMA.md)",
        VERSION_CODE,
    )
