"""``python -m epp_tools.bench.compiled``: what it compiles and how it reads a bench report."""

from __future__ import annotations

from pathlib import Path

from epp_tools.bench import compiled

ROOT = Path(__file__).resolve().parents[3]


def test_every_module_it_compiles_exists_and_nests_no_class() -> None:
    for module in compiled.MODULES:
        source = (ROOT / module).read_text()
        assert "\n    class " not in source, f"{module}: mypyc compiles no nested class"


def test_the_epp_cpu_per_request_is_read_net_of_idle_per_workload() -> None:
    def result(target: str, ok: int, epp_s: float) -> dict[str, object]:
        return {"target": target, "ok": ok, "cpu_net_s": {"epp": epp_s, "envoy": 9.0}}

    report = {
        "workloads": [
            {"name": "a", "results": [result("epp", 400, 0.32)]},
            {"name": "b", "results": [result("sglang", 224, 0.5), result("epp", 224, 0.448)]},
            {"name": "c", "results": [result("epp", 0, 0.0)]},  # nothing served: no figure
        ]
    }
    ms = compiled.epp_ms(report)
    assert ms.keys() == {"a", "b"}
    assert abs(ms["a"] - 0.8) < 1e-9
    assert abs(ms["b"] - 2.0) < 1e-9
