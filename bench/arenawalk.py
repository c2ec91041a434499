"""Run inside gdb, attached to a Python process (`python -m bench.connmem arenas` does it): walks CPython's
small-object arenas (obmalloc's `arenas` table, named by the interpreter's debug symbols) and prints one
JSON line per arena: its pools, how many are free, and the type of each live block in it, read from the
block's object header (a block that is no object, such as a dict's table, is "?").

Not a module of the bench's Python: gdb's own interpreter runs it, with the `gdb` module.
"""

import collections
import json
import struct

import gdb  # type: ignore[import-not-found]

POOL_SIZE = 16384
POOL_HEADER = 48  # (struct pool_header, rounded up to the 16-byte alignment)

inferior = gdb.selected_inferior()


def u32(address: int) -> int:
    return int(struct.unpack("<I", bytes(inferior.read_memory(address, 4)))[0])


def u64(address: int) -> int:
    return int(struct.unpack("<Q", bytes(inferior.read_memory(address, 8)))[0])


TYPE_TYPE = int(gdb.parse_and_eval("(unsigned long)&PyType_Type"))


def is_type(address: int) -> bool:
    if address < 4096:
        return False
    try:
        meta = u64(address + 8)
        return meta == TYPE_TYPE or (meta > 4096 and u64(meta + 8) == TYPE_TYPE)
    except gdb.MemoryError:
        return False


def type_of(block: int) -> str:
    """The block's type name; "gc:" before it when a GC header comes first (a container)."""
    for offset, tag in ((8, ""), (24, "gc:")):
        try:
            candidate = u64(block + offset)
        except gdb.MemoryError:
            continue
        if is_type(candidate):
            name = bytes(inferior.read_memory(u64(candidate + 24), 80)).split(b"\0")[0]
            return tag + name.decode(errors="replace")
    return "?"


def walk() -> None:
    arenas = gdb.parse_and_eval("arenas")
    for i in range(int(gdb.parse_and_eval("maxarenas"))):
        arena = arenas[i]
        address = int(arena["address"])
        if not address:
            continue
        free, total = int(arena["nfreepools"]), int(arena["ntotalpools"])
        live: collections.Counter[str] = collections.Counter()
        if free * 2 >= total:  # (only the mostly free ones: what keeps them)
            pool = (address + POOL_SIZE - 1) & ~(POOL_SIZE - 1)
            while pool < int(arena["pool_address"]):
                if u32(pool):  # (blocks in use)
                    size = (u32(pool + 36) + 1) * 16
                    unused, block = set(), u64(pool + 8)
                    while block:
                        unused.add(block)
                        block = u64(block)
                    block = pool + POOL_HEADER
                    while block < pool + u32(pool + 40):
                        if block not in unused:
                            live[type_of(block)] += 1
                        block += size
                pool += POOL_SIZE
        print("ARENA " + json.dumps({"index": i, "free": free, "total": total, "live": dict(live)}))


walk()
