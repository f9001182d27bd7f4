"""Generated stubs stay in sync with protos/, and the gateway stays free of torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_generated_stubs_match_protos(tmp_path):
    protos = sorted((ROOT / "protos" / "minedraft" / "v1").glob("*.proto"))
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'protos'}",
                    f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}", f"--pyi_out={tmp_path}",
                    *map(str, protos)], check=True)
    generated = sorted(p.name for p in (tmp_path / "minedraft" / "v1").iterdir())
    assert generated, "protoc produced nothing"
    for name in generated:
        committed = ROOT / "minedraft" / "v1" / name
        assert committed.read_text() == (tmp_path / "minedraft" / "v1" / name).read_text(), (
            f"minedraft/v1/{name} is stale: run `make protos`")


def test_gateway_and_client_do_not_import_torch():
    code = ("import sys, gateway.main, gateway.batch_manager, gateway.servicer, minedraft.client; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
