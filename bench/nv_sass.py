"""Disassemble the kernels the NVIDIA Vulkan driver compiled for dg, from its shader disk cache.

Run dg with the cache kept where you choose, then point this script at it:

    export __GL_SHADER_DISK_CACHE=1 __GL_SHADER_DISK_CACHE_PATH=/tmp/nvcache \
           __GL_SHADER_DISK_CACHE_SKIP_CLEANUP=1
    ./target/release/xtask bench-gpu --weights f16 --steps 1
    python3 bench/nv_sass.py /tmp/nvcache out/ --nvdisasm nvdisasm

The cache's `.bin` files hold zstd frames; each frame that decompresses to a compiled kernel
holds, 8 bytes in, a container that `nvdisasm -b SM90` reads whole (register count, barriers,
symbol table, then the SASS). For every kernel with matrix instructions the script writes
`kNNN.sass` and prints one line: registers, HMMA / LDG / LDSM / STS / BAR.SYNC counts, and how many
global loads are waited for before any HMMA follows them (a prefetch that the compiler undid:
see `crates/dg-kernels/src/coop_kloop.rs`), then, for the K loop, one line per stretch between its
barriers with the instructions that run (the prefetch pins' blocks, branched over, left out) and
the HMMA, LDSM, LDG and STS among them, and a line counting after how many barriers each of its
global loads is first waited for (`coop_kloop::Ring`), and one with the loop's most frequent
opcodes in one pass. Tooling only: needs the `zstd` command and nvdisasm
(CUDA's, or the `nvidia-cuda-nvdisasm` wheel's); the `zstandard` Python module does instead of the
`zstd` command.
"""

import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
LINE = re.compile(r"/\*([0-9a-f]{4})\*/\s+(.*?);\s+/\* (0x[0-9a-f]+) \*/")
HIGH = re.compile(r"^\s+/\* (0x[0-9a-f]+) \*/\s*$")
# A branch, its predicate (group 1, empty when it always jumps) and its target (group 2).
PREDICATE = r"@!?U?P\w+\s+"
BRANCH = re.compile(rf"^({PREDICATE})?BRA\s+(0x[0-9a-f]+)")
# What a prefetch pin's block holds (`coop_kloop::prefetch`: stores of the loaded values, and the
# moves that gather them): a forward branch over nothing else is a pin, which no run executes.
PIN = re.compile(r"^(STS|UMOV|NOP|MOV|IMAD\.MOV|PRMT)\b")


def decompressor():
    """A function that decompresses the zstd frame at the start of its bytes (b"" where it fails):
    the `zstandard` module where it is installed, else the `zstd` command; exits with a message
    naming both when neither is there."""
    try:
        import zstandard

        def one(data):
            try:
                return zstandard.ZstdDecompressor().decompressobj().decompress(data)
            except zstandard.ZstdError:
                return b""

        return one
    except ImportError:
        pass
    if shutil.which("zstd") is None:
        sys.exit("nv_sass.py: needs the zstd command or the zstandard Python module to read the driver's cache")
    return lambda data: subprocess.run(["zstd", "-d", "-c", "-q"], input=data, capture_output=True).stdout


def frames(path, decompress):
    """Every zstd frame of a cache file, decompressed (frames that fail are skipped)."""
    data = open(path, "rb").read()
    at = data.find(ZSTD_MAGIC)
    while at >= 0:
        out = decompress(data[at:])
        if out:
            yield out
        at = data.find(ZSTD_MAGIC, at + 4)


def instructions(nvdisasm, binary):
    """(address, text, write scoreboard, wait mask) of each instruction, from `-hex` output: the
    control bits are the high word's bits 41 and up (stall 4, yield 1, write 3, read 3, wait 6)."""
    out = subprocess.run([nvdisasm, "-b", "SM90", "-hex", binary], capture_output=True, text=True).stdout
    rows, current = [], None
    for line in out.splitlines():
        m = LINE.search(line)
        if m:
            current = (int(m.group(1), 16), m.group(2).strip())
            continue
        m = HIGH.match(line)
        if m and current:
            control = int(m.group(1), 16) >> 41
            rows.append((current[0], current[1], (control >> 5) & 7, (control >> 11) & 0x3F))
            current = None
    return rows


def loads_waited_before_hmma(rows):
    """How many global loads have their first consumer before any HMMA follows them, walking
    forward and taking every predicated forward branch (so that the K loop's pins, behind a branch
    every run takes, do not count as consumers; a heuristic)."""
    at = {address: i for i, (address, _, _, _) in enumerate(rows)}
    early = 0
    for i, (_, text, write, _) in enumerate(rows):
        if "LDG" not in text or write == 7:
            continue
        j = i + 1
        while j < len(rows):
            address, later, _, wait = rows[j]
            if wait >> write & 1:
                early += 1
                break
            if "HMMA" in later:
                break
            m = BRANCH.match(later)
            target = at.get(int(m.group(2), 16)) if m and m.group(1) else None
            j = target if target is not None and target > j else j + 1
    return early


def loop_body(rows):
    """The instructions the longest loop (the K loop) executes in one pass, in order, skipping the
    blocks that a forward branch jumps over when they hold only stores and moves (`PIN`: the K
    loop's prefetch pins, which no run executes: `coop_kloop::prefetch`). Empty where the kernel
    has no backward branch."""
    at = {address: i for i, (address, _, _, _) in enumerate(rows)}
    loops = []
    for i, (address, text, _, _) in enumerate(rows):
        m = BRANCH.match(text)
        if m and int(m.group(2), 16) < address and int(m.group(2), 16) in at:
            loops.append((at[int(m.group(2), 16)], i))
    if not loops:
        return []
    first, last = max(loops, key=lambda l: l[1] - l[0])
    body, i = [], first
    while i <= last:
        m = BRANCH.match(rows[i][1])
        if m and m.group(1) and int(m.group(2), 16) in at:
            target = at[int(m.group(2), 16)]
            if i < target <= last and all(PIN.match(rows[j][1]) for j in range(i + 1, target)):
                i = target
                continue
        body.append(rows[i])
        i += 1
    return body


def loop_steps(rows):
    """The executed instruction mix of the K loop (`loop_body`), one dict per stretch between its
    barriers (a K step, or half of one where the loop has two barriers a step): instructions
    executed and the HMMA, LDSM, LDG and STS among them."""
    steps, current = [], None
    for _, text, _, _ in loop_body(rows):
        text = re.sub("^" + PREDICATE, "", text)
        current = current or {"executed": 0, "HMMA": 0, "LDSM": 0, "LDG": 0, "STS": 0}
        current["executed"] += 1
        for op in ("HMMA", "LDSM", "LDG", "STS"):
            current[op] += text.startswith(op)
        if text.startswith("BAR.SYNC"):
            steps.append(current)
            current = None
    if current:
        steps.append(current)
    return steps


def loop_mix(rows, top=16):
    """The K loop's executed opcodes (`loop_body`, one pass of the unrolled loop), most frequent
    first: [(opcode with its modifiers, count)], the `top` largest."""
    return collections.Counter(re.sub("^" + PREDICATE, "", text).split()[0] for _, text, _, _ in loop_body(rows)).most_common(top)


def ring_waits(rows):
    """How many barriers each global load of the K loop lives before an instruction waits for it:
    {age: loads}, walking the loop body (`loop_body`) twice (loads issued late in one pass are
    waited in the next). A scoreboard wait waits for every load on that scoreboard, so a ring `d`
    steps deep shows ages near `d` steps' barriers only if nothing waits for its loads sooner;
    ages of 0 or 1 mean each step waits for loads it has just issued (`coop_kloop::Ring`)."""
    body = loop_body(rows)
    outstanding = {b: [] for b in range(6)}
    barriers, ages = 0, {}
    for n, (_, text, write, wait) in enumerate(body + body):
        text = re.sub("^" + PREDICATE, "", text)
        for b in range(6):
            if wait >> b & 1:
                for issued in outstanding[b]:
                    if n >= len(body):
                        ages[barriers - issued] = ages.get(barriers - issued, 0) + 1
                outstanding[b] = []
        if text.startswith("BAR.SYNC"):
            barriers += 1
        if text.startswith("LDG") and write != 7:
            outstanding[write].append(barriers)
    return dict(sorted(ages.items()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cache", help="the __GL_SHADER_DISK_CACHE_PATH directory")
    parser.add_argument("out", help="where to write kNNN.sass")
    parser.add_argument("--nvdisasm", default="nvdisasm")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    decompress = decompressor()
    n = 0
    for path in sorted(glob.glob(os.path.join(args.cache, "**", "*.bin"), recursive=True)):
        for frame in frames(path, decompress):
            payload = frame[8:]
            binary = os.path.join(args.out, f"k{n:03d}.bin")
            open(binary, "wb").write(payload[: len(payload) // 16 * 16])
            sass = subprocess.run([args.nvdisasm, "-b", "SM90", binary], capture_output=True, text=True).stdout
            if "HMMA" not in sass:
                os.remove(binary)
                continue
            open(os.path.join(args.out, f"k{n:03d}.sass"), "w").write(sass)
            regs = re.search(r"Register count=(\d+)", sass)
            counts = {op: len(re.findall(op, sass)) for op in ("HMMA", "LDG", "LDSM", "STS", "BAR.SYNC")}
            rows = instructions(args.nvdisasm, binary)
            early = loads_waited_before_hmma(rows)
            print(f"k{n:03d} registers {regs.group(1) if regs else '?'} " + " ".join(f"{k}={v}" for k, v in counts.items()) + f" loads-waited-before-HMMA={early}")
            for step in loop_steps(rows):
                print("    K loop, between barriers: " + " ".join(f"{k}={v}" for k, v in step.items()))
            mix = loop_mix(rows)
            if mix:
                print("    K loop, one pass's opcodes: " + " ".join(f"{op}:{count}" for op, count in mix))
            waits = ring_waits(rows)
            if waits:
                print("    K loop, loads waited after this many barriers: " + " ".join(f"{age}:{count}" for age, count in waits.items()))
            n += 1


if __name__ == "__main__":
    main()
