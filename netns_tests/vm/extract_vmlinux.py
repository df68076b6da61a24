"""Extract the uncompressed ``vmlinux`` ELF from an x86 bzImage (``/boot/vmlinuz-*``).

Why: qemu can boot an ELF kernel that carries a PVH entry note (``CONFIG_PVH=y``, as in Debian's
kernels) directly, which skips the bzImage's self-decompression. Under TCG that decompression
costs several seconds of every boot.

How: the x86 boot protocol (Documentation/arch/x86/boot.rst, protocol 2.08 and later) puts
``setup_sects`` at offset 0x1f1 and ``payload_offset`` / ``payload_length`` (u32, little
endian) at 0x248 / 0x24c of the setup header; the payload offset counts from the start of the
protected-mode code, which begins at ``(setup_sects or 4) + 1`` sectors of 512 bytes. The payload
is the compressed vmlinux (xz for Debian 12's kernels; gzip, zstd and lzma also handled). When
the header does not say, the file is scanned for a compression magic whose decompressed data
starts with the ELF magic.

Usage: ``python3 extract_vmlinux.py BZIMAGE OUT`` (writes OUT atomically; exit 1 on failure).
"""

from __future__ import annotations

import lzma
import os
import shutil
import struct
import subprocess
import sys
import zlib

ELF_MAGIC = b"\x7fELF"
MAGICS = (
    ("xz", b"\xfd7zXZ\x00"),
    ("gzip", b"\x1f\x8b\x08"),
    ("zstd", b"\x28\xb5\x2f\xfd"),
    ("lzma", b"\x5d\x00\x00"),
)


def _decompress(kind: str, data: bytes) -> bytes | None:
    """Decompress one stream starting at data[0]; None when it is not a valid stream."""
    try:
        if kind == "xz":
            return lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data)
        if kind == "lzma":
            return lzma.LZMADecompressor(format=lzma.FORMAT_ALONE).decompress(data)
        if kind == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data)
        if kind == "zstd":
            zstd = shutil.which("zstd")
            if zstd is None:
                return None
            proc = subprocess.run([zstd, "-dcq"], input=data, capture_output=True, check=False)
            # zstd complains about trailing garbage but has written the frame by then
            return proc.stdout or None
    except (lzma.LZMAError, zlib.error, EOFError):
        return None
    return None


def _payload_from_header(image: bytes) -> bytes | None:
    if len(image) < 0x250 or image[0x202:0x206] != b"HdrS":
        return None
    version = struct.unpack_from("<H", image, 0x206)[0]
    if version < 0x0208:
        return None
    setup_sects = image[0x1F1] or 4
    offset, length = struct.unpack_from("<II", image, 0x248)
    start = (setup_sects + 1) * 512 + offset
    if not length or start + length > len(image):
        return None
    return image[start : start + length]


def extract(image: bytes) -> bytes:
    candidates = []
    payload = _payload_from_header(image)
    if payload is not None:
        candidates.append(payload)
    candidates.append(image)
    for blob in candidates:
        for kind, magic in MAGICS:
            pos = blob.find(magic)
            while pos != -1:
                out = _decompress(kind, blob[pos:])
                if out and out.startswith(ELF_MAGIC):
                    return out
                pos = blob.find(magic, pos + 1)
    raise ValueError("no compressed ELF kernel found in the image (xz, gzip, zstd, lzma tried)")


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(f"usage: {argv[0]} BZIMAGE OUT", file=sys.stderr)
        return 2
    src, dst = argv[1], argv[2]
    try:
        with open(src, "rb") as f:
            image = f.read()
        vmlinux = extract(image)
    except (OSError, ValueError) as e:
        print(f"extract_vmlinux: {src}: {e}", file=sys.stderr)
        return 1
    tmp = f"{dst}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(vmlinux)
    os.replace(tmp, dst)
    print(f"extract_vmlinux: {src} -> {dst} ({len(vmlinux)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
