"""Compile the v1 contract into Python: ``python proto/generate.py [--out DIR]`` (or ``make proto``).

Sources are compiled with ``-I proto``, so a source ``proto/streamingnode/v1/x.proto`` becomes the
modules ``streamingnode/v1/x_pb2.py`` (+ ``.pyi`` stub, + ``x_pb2_grpc.py`` when it declares a service)
under DIR, importable as ``streamingnode.v1.x_pb2``.  DIR defaults to the repository root, so the
committed modules in ``streamingnode/v1/`` are rewritten in place.

Output is generated into a scratch directory first and only then replaces the previous generated
files, so a failed run leaves them untouched and a deleted ``.proto`` leaves no stale module behind.
The result depends only on the sources and the pinned grpcio-tools version, which is what lets
``tests/unit/test_proto.py`` compare the committed files byte for byte with a fresh run.

This file is a script, not a module of any package: there is deliberately no ``proto/__init__.py``
(the import name ``proto`` belongs to proto-plus).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
REPO_ROOT = PROTO_ROOT.parent
PACKAGE_DIRS = (Path("streamingnode", "v1"),)
"""Directories (relative to PROTO_ROOT and to the output root) that hold sources and generated modules."""

GENERATED_PATTERNS = ("*_pb2.py", "*_pb2.pyi", "*_pb2_grpc.py")
"""Every file matching these in a package directory is generated; anything else there is hand-written."""


def proto_sources() -> list[Path]:
    """The ``.proto`` files to compile, relative to PROTO_ROOT, in a stable order."""
    return sorted(
        path.relative_to(PROTO_ROOT) for pkg in PACKAGE_DIRS for path in (PROTO_ROOT / pkg).glob("*.proto")
    )


def _well_known_protos() -> Path:
    """The include directory grpc_tools ships for ``google/protobuf/*.proto``."""
    return Path(str(resources.files("grpc_tools") / "_proto"))


def protoc_args(out: Path) -> list[str]:
    """The full protoc command line (argv[0] included) that writes the generated modules under ``out``."""
    return [
        "grpc_tools.protoc",
        f"--proto_path={PROTO_ROOT}",
        f"--proto_path={_well_known_protos()}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        # protoc maps each absolute path to its name under the first --proto_path
        # ("streamingnode/v1/x.proto"), so the output does not depend on where the repository lives
        # or on the current directory.
        *(str(PROTO_ROOT / source) for source in proto_sources()),
    ]


def _generated_files(directory: Path) -> list[Path]:
    return sorted({path for pattern in GENERATED_PATTERNS for path in directory.glob(pattern)})


def generate(out: Path = REPO_ROOT) -> list[Path]:
    """Regenerate the modules under ``out`` and return their paths.

    Previously generated files in the package directories under ``out`` are replaced; hand-written
    files there (``__init__.py``) are left alone.  Raises ``RuntimeError`` when protoc fails.
    """
    from grpc_tools import protoc  # noqa: PLC0415 - heavy, and only needed when generating

    out = out.resolve()
    with tempfile.TemporaryDirectory(prefix="streamingnode-proto-") as scratch_name:
        scratch = Path(scratch_name)
        status = protoc.main(protoc_args(scratch))
        if status != 0:
            raise RuntimeError(f"protoc failed with exit status {status}")
        written: list[Path] = []
        for pkg in PACKAGE_DIRS:
            target = out / pkg
            target.mkdir(parents=True, exist_ok=True)
            for stale in _generated_files(target):
                stale.unlink()
            for fresh in _generated_files(scratch / pkg):
                destination = target / fresh.name
                shutil.copyfile(fresh, destination)
                written.append(destination)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO_ROOT,
        help="root directory to write streamingnode/v1/ under (default: the repository root)",
    )
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
