"""The broker's per-message path compiled with mypyc, built into a cache folder outside the repo.

Issue 30: the interpreted path costs 2.6-4.9x rumqttd's CPU per message. Compiled as a whole (the modules
a PUBLISH goes through, one mypyc build, so their calls to one another stay native), it costs 1.6-1.9x
less (docs/performance.md). Compiling only the leaves gains nothing: the crossings between compiled and
interpreted code eat it.

A build is a copy of broker/ with the extension modules beside their sources, in
    $CACHE/compiled/<hash>/fleetmq/broker/       (CACHE defaults to ~/.cache/fleetmq)
where the hash covers every broker source, the Python and the mypy version: an edit anywhere gives a new
build, never a stale one. Put the folder first on PYTHONPATH and `fleetmq.broker` is the compiled one
(the editable install's finder comes after sys.path); without it, the interpreted modules run as ever.

    python scripts/compiled.py            build what is missing, print the folder for PYTHONPATH
    python scripts/compiled.py --path     print it only (builds nothing)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BROKER = ROOT / "broker"
#: the per-message path: what a PUBLISH goes through from the socket's bytes to a subscriber's write.
#: (mqueue stays interpreted: a deque subclass cannot be a native class, and its work is the deque's.)
MODULES = (
    "codec",
    "message",
    "topic",
    "router",
    "inflight",
    "session",
    "channel",
    "cm",
    "telemetry",
    "limiter",
    "keepalive",
    "negotiation",
)


def cache() -> Path:
    return Path(os.environ.get("CACHE") or Path.home() / ".cache" / "fleetmq")


def fingerprint() -> str:
    """What a build depends on: every broker source, this Python, this mypy."""
    import mypy.version

    h = hashlib.sha256(f"{sys.version}\n{mypy.version.__version__}\n{MODULES}\n".encode())
    for path in sorted(BROKER.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".so":
            h.update(str(path.relative_to(BROKER)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def folder() -> Path:
    return cache() / "compiled" / fingerprint()


def build(dest: Path) -> None:
    """Copy broker/ and compile MODULES in the copy; the finished folder appears at once (a rename), and
    the builds of other sources go."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".build-"))
    try:
        package = work / "fleetmq" / "broker"
        shutil.copytree(BROKER, package, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        mypyc = Path(sys.executable).with_name("mypyc")
        files = [f"fleetmq/broker/{m}.py" for m in MODULES]
        run = subprocess.run(
            [str(mypyc), "--explicit-package-bases", *files], cwd=work, capture_output=True, text=True
        )
        if run.returncode != 0:
            errors = [line for line in run.stdout.splitlines() if "error" in line]
            sys.exit("compiled: mypyc failed:\n" + "\n".join(errors or run.stdout.splitlines()[-20:]))
        missing = [m for m in MODULES if not list(package.glob(f"{m}.*.so"))]
        if missing:
            sys.exit(f"compiled: no extension module for {', '.join(missing)}")
        shutil.rmtree(work / "build")
        os.rename(work, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for other in dest.parent.iterdir():
        if other != dest and not other.name.startswith("."):
            shutil.rmtree(other, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--path", action="store_true", help="print the folder only")
    args = parser.parse_args(argv)
    dest = folder()
    if not args.path and not dest.exists():
        print(f"compiled: building {len(MODULES)} modules with mypyc into {dest} ...", file=sys.stderr)
        build(dest)
    print(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
