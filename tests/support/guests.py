"""Boot-sector guests whose CPU behaviour is known: spin, idle and duty cycle.

A guest is a 512-byte x86 real-mode boot sector (bytes written here, no assembler needed), padded to
1 MiB because SeaBIOS refuses disks smaller than one CHS cylinder. Every guest keeps a 64-bit counter
at guest-physical address ``COUNTER_ADDR`` that it increments while it runs; reading it with
``virDomainMemoryPeek`` proves that a guest kept running across save/restore or migration.

* ``spin``: increments the counter forever (100 % of a core).
* ``idle``: ``sti; hlt`` in a loop, incrementing once per BIOS timer tick (18.2 Hz): under 1 %.
* ``duty``: reprograms PIT channel 0 to 100 Hz, then after every tick spins (counting) until the PIT
  count falls below ``(1 - duty) * divisor``, then halts: ``duty`` of a core.

Machine code of the duty guest (offsets after the common prologue)::

    mov al,0x34; out 0x43,al          PIT ch0, lo/hi, mode 2 (rate generator)
    mov al,lo; out 0x40,al; mov al,hi; out 0x40,al
    sti
  main:  hlt
  spin:  add dword [0x7e00],1; adc dword [0x7e04],0
         xor al,al; out 0x43,al       latch ch0
         in al,0x40; mov ah,al; in al,0x40; xchg ah,al
         cmp ax,threshold; ja spin; jmp main
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from vmctl.errors import OutOfRange

COUNTER_ADDR = 0x7E00
SECTOR = 512
IMAGE_SIZE = 1 << 20  # SeaBIOS wants at least one CHS cylinder (516,096 bytes)
PIT_HZ = 1193182
TICK_HZ = 100


class GuestKind(StrEnum):
    SPIN = "spin"
    IDLE = "idle"
    DUTY = "duty"


# Fixed-size encodings (16-bit real mode).
_PROLOGUE = bytes.fromhex(
    "fa"  # cli
    "31c0"  # xor ax,ax
    "8ed8"  # mov ds,ax
    "8ed0"  # mov ss,ax
    "bc007c"  # mov sp,0x7c00
    "66c706007e00000000"  # mov dword [0x7e00],0
    "66c706047e00000000"  # mov dword [0x7e04],0
)
_COUNT = bytes.fromhex("668306007e01" "668316047e00")  # add dword [0x7e00],1; adc dword [0x7e04],0
_STI = b"\xfb"
_HLT = b"\xf4"


@dataclass(frozen=True, slots=True)
class _Jump:
    opcode: int  # 0xEB jmp rel8, 0x77 ja rel8
    label: str


_Item = bytes | str | _Jump  # str = label definition


def _assemble(items: list[_Item]) -> bytes:
    labels: dict[str, int] = {}
    pos = 0
    for it in items:
        if isinstance(it, str):
            labels[it] = pos
        elif isinstance(it, _Jump):
            pos += 2
        else:
            pos += len(it)
    out = bytearray()
    for it in items:
        if isinstance(it, str):
            continue
        if isinstance(it, _Jump):
            rel = labels[it.label] - (len(out) + 2)
            if not -128 <= rel <= 127:
                raise ValueError(f"jump to {it.label} out of rel8 range: {rel}")
            out += bytes([it.opcode, rel & 0xFF])
        else:
            out += it
    return bytes(out)


def boot_sector(kind: GuestKind | str, duty: float | None = None) -> bytes:
    """The 512-byte boot sector of a guest (ends in the 0x55AA signature)."""
    kind = GuestKind(kind)
    items: list[_Item] = [_PROLOGUE]
    if kind is GuestKind.SPIN:
        items += ["loop", _COUNT, _Jump(0xEB, "loop")]
    elif kind is GuestKind.IDLE:
        items += [_STI, "loop", _HLT, _COUNT, _Jump(0xEB, "loop")]
    else:
        if duty is None or isinstance(duty, bool) or not 0.0 < duty < 1.0:
            raise OutOfRange(what="duty", value=duty, allowed="fraction in (0, 1) for a duty-cycle guest")
        divisor = round(PIT_HZ / TICK_HZ)
        threshold = round(divisor * (1.0 - duty))
        items += [
            bytes([0xB0, 0x34, 0xE6, 0x43]),  # mov al,0x34; out 0x43,al
            bytes([0xB0, divisor & 0xFF, 0xE6, 0x40, 0xB0, divisor >> 8, 0xE6, 0x40]),
            _STI,
            "main",
            _HLT,
            "spin",
            _COUNT,
            bytes.fromhex("30c0" "e643" "e440" "88c4" "e440" "86c4"),
            b"\x3d" + struct.pack("<H", threshold),  # cmp ax,threshold
            _Jump(0x77, "spin"),
            _Jump(0xEB, "main"),
        ]
    code = _assemble(items)
    if len(code) > SECTOR - 2:
        raise ValueError("boot sector code too long")
    return code + bytes(SECTOR - 2 - len(code)) + b"\x55\xaa"


def guest_image(kind: GuestKind | str, duty: float | None = None) -> bytes:
    """A whole raw disk image: the boot sector padded with zeros to ``IMAGE_SIZE``."""
    sector = boot_sector(kind, duty)
    return sector + bytes(IMAGE_SIZE - len(sector))


def write_guest_image(path: str | Path, kind: GuestKind | str, duty: float | None = None) -> Path:
    """Write a guest image to ``path`` (world-readable: QEMU may run as another user)."""
    p = Path(path)
    p.write_bytes(guest_image(kind, duty))
    p.chmod(0o644)
    return p


def decode_counter(raw: bytes) -> int:
    """The guest's 64-bit counter from the 8 bytes peeked at ``COUNTER_ADDR``."""
    if len(raw) != 8:
        raise ValueError(f"expected 8 bytes, got {len(raw)}")
    value: int = struct.unpack("<Q", raw)[0]
    return value
