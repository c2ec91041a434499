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

    python scripts/compiled.py                   build what is missing, print the folder for PYTHONPATH
    python scripts/compiled.py --path            print it only (builds nothing)
    python scripts/compiled.py --or-interpreted  the same, but where it cannot be built (no C compiler,
                                                 no mypy) say why on stderr and print nothing: `make run`
    python scripts/compiled.py --into SITE       compile into an installed fleetmq (SITE/fleetmq/broker,
                                                 the extension modules beside its sources): the image
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
#: the per-message path: what a PUBLISH goes through from the socket's bytes to a subscriber's write,
#: with the counters it bumps (metrics) and the clock it reads.
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
    "metrics",
    "connection",
    "clock",
    "poller",
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


def compile_into(work: Path) -> None:
    """Copy broker/ into `work` as fleetmq/broker and compile MODULES there with mypyc: the shared library
    lands in `work`, each module's extension beside its source."""
    package = work / "fleetmq" / "broker"
    shutil.copytree(BROKER, package, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    mypyc = Path(sys.executable).with_name("mypyc")
    files = [f"fleetmq/broker/{m}.py" for m in MODULES]
    try:
        run = subprocess.run(
            [str(mypyc), "--explicit-package-bases", *files], cwd=work, capture_output=True, text=True
        )
    except OSError as e:
        raise BuildError(f"cannot run mypyc: {e}") from e
    if run.returncode != 0:
        # (mypy's "file:line: error: ..." and the C compiler's "error: ..."; not its command lines)
        lines = (run.stdout + "\n" + run.stderr).splitlines()
        errors = [line for line in lines if "error:" in line]
        raise BuildError("mypyc failed:\n" + "\n".join(errors or lines[-20:]))
    missing = [m for m in MODULES if not list(package.glob(f"{m}.*.so"))]
    if missing:
        raise BuildError(f"no extension module for {', '.join(missing)}")
    shutil.rmtree(work / "build")


class BuildError(Exception):
    """The compiled modules could not be built here; the interpreted ones still run."""


def build(dest: Path) -> None:
    """Build into `dest`; the finished folder appears at once (a rename), and the builds of other
    sources go."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".build-"))
    try:
        compile_into(work)
        os.rename(work, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for other in dest.parent.iterdir():
        if other != dest and not other.name.startswith("."):
            shutil.rmtree(other, ignore_errors=True)


def install(site: Path) -> list[Path]:
    """Compile, then put the extension modules into an installed fleetmq under `site` (site-packages),
    beside the sources they were built from; returns what it wrote."""
    target = site / "fleetmq" / "broker"
    if not (target / "channel.py").is_file():
        raise BuildError(f"no installed fleetmq.broker in {site}")
    with tempfile.TemporaryDirectory(prefix="fleetmq-compile-") as tmp:
        work = Path(tmp)
        compile_into(work)
        written = []
        for so in sorted(work.glob("*.so")):  # the shared library of the group, a top-level module
            written.append(Path(shutil.copy2(so, site / so.name)))
        for so in sorted((work / "fleetmq" / "broker").glob("*.so")):
            written.append(Path(shutil.copy2(so, target / so.name)))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--path", action="store_true", help="print the folder only")
    mode.add_argument("--or-interpreted", action="store_true", help="print nothing where it cannot be built")
    mode.add_argument("--into", type=Path, metavar="SITE", help="compile into an installed fleetmq")
    args = parser.parse_args(argv)
    try:
        if args.into:
            for path in install(args.into):
                print(path)
            return 0
        dest = folder()
        if not args.path and not dest.exists():
            print(f"compiled: building {len(MODULES)} modules with mypyc into {dest} ...", file=sys.stderr)
            build(dest)
    except (BuildError, ImportError) as e:
        if not args.or_interpreted:
            sys.exit(f"compiled: {e}")
        print(f"compiled: {e}\ncompiled: the interpreted modules run instead", file=sys.stderr)
        return 0
    print(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
