"""Compile the project's protocol buffers into ``epp/_proto`` (committed; a test fails when they
are stale). Needs grpcio-tools (the ``test`` extra):

    .venv/bin/python proto/generate.py            # regenerate in place
    .venv/bin/python proto/generate.py OUT_DIR    # write the modules to OUT_DIR instead

Each ``proto/<path>/<name>.proto`` becomes ``<package with _ for .>_pb2.py`` and its ``.pyi``
(``epp/admin/v1/admin.proto`` → ``epp_admin_v1_pb2``). Only messages are generated: the servers
and clients bind the methods with ``grpc``'s generic handlers, so no generated module imports
another by a path that would clash with the ``epp`` package.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
TARGET = ROOT.parent / "epp" / "_proto"


def module_name(proto: Path) -> str:
    """``epp/admin/v1/admin.proto`` → ``epp_admin_v1_pb2`` (its folder is its package)."""
    return "_".join(proto.parent.parts) + "_pb2"


def generate(out_dir: Path) -> list[Path]:
    from grpc_tools import protoc

    protos = sorted(p.relative_to(ROOT) for p in ROOT.rglob("*.proto"))
    # protobuf's own types (google/protobuf/struct.proto), as grpcio-tools ships them
    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    written: list[Path] = []
    with tempfile.TemporaryDirectory() as tmp:
        args = ["protoc", f"-I{ROOT}", f"-I{well_known}", f"--python_out={tmp}", f"--pyi_out={tmp}"]
        if protoc.main([*args, *(str(p) for p in protos)]) != 0:
            raise RuntimeError("protoc failed")
        out_dir.mkdir(parents=True, exist_ok=True)
        for proto in protos:
            for suffix in (".py", ".pyi"):
                src = Path(tmp) / proto.parent / f"{proto.stem}_pb2{suffix}"
                dst = out_dir / f"{module_name(proto)}{suffix}"
                shutil.copyfile(src, dst)
                written.append(dst)
    return written


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else TARGET):
        print(path)
