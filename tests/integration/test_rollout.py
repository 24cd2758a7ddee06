"""A DisaggregatedSet rollout through a real Envoy, traffic flowing the whole time: simulated
prefill and decode pods of two revisions, A and B, with the set's pods moving from A to B step by
step (new-revision pods join, old-revision pods leave, as the controller rolls them), under
``disaggregatedset-rollout-screener`` and always-disaggregated P/D.

Every request is really disaggregated: the decode pod runs the prefill leg on the pod the EPP
named (the simulator's sidecar), and the answer names both (``x-sim-pod`` with ``x-sim-role``,
``x-sim-saw-prefiller``, ``x-sim-prefill-pod``). Each simulated pod keeps its revision for its
whole life, so the pair a request was served by is known exactly: no request pairs pods of two
revisions, at any step, mid-transition included. The gating share gauge moves to each step's
expected shares (``max-role``), and the traffic follows it; a strict revision header pins a
revision, and fails closed once that revision is gone.

Slices: with a ``prefer`` selector and ``header-label-affinity-scorer`` in both profiles, a request
naming a slice is prefilled and decoded in that slice and the answer is stamped with it; an
unknown slice is only a preference that matches nothing."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.conftest import COMPLETION, metrics_text, post, wait_for

pytestmark = [pytest.mark.envoy]

REV = "disaggregatedset.x-k8s.io/revision"
ROLE = "disaggregatedset.x-k8s.io/role"
CONFIG = """\
    plugins:
    - type: disaggregatedset-rollout-screener
      name: rollout-screener
      parameters:
        scope: {labelSelector: "disaggregatedset.x-k8s.io/name=my-set"}
        headerSelectors:
        - {name: revision, headerName: x-disagg-revision,
           labelKey: disaggregatedset.x-k8s.io/revision, mode: strict}
        revisionGating: {mode: max-role, requireRoles: {values: [prefill, decode]}}
    - type: prefill-filter
    - type: decode-filter
    - type: random-picker
    - type: always-disagg-pd-decider
    - type: disagg-profile-handler
      parameters:
        deciders: {prefill: always-disagg-pd-decider}
    schedulingProfiles:
    - name: prefill
      plugins:
      - pluginRef: prefill-filter
      - pluginRef: random-picker
    - name: decode
      plugins:
      - pluginRef: decode-filter
      - pluginRef: random-picker
    """
PREFILL_REVISIONS = ("A", "A", "B", "B")
DECODE_REVISIONS = ("A", "A", "A", "B", "B", "B")
# Each step lists the pods in the pool (prefill and decode indexes) and the shares max-role gives:
# decode is the larger role (3 prefill against 4 decode pods at steps 3 and 4).
STEPS: tuple[tuple[tuple[int, ...], tuple[int, ...], dict[str, float]], ...] = (
    ((0, 1), (0, 1, 2), {"A": 1.0}),
    ((0, 1), (0, 1, 2, 3), {"A": 1.0, "B": 0.0}),  # B has a decode pod but no prefill pod
    ((0, 1, 2), (0, 1, 2, 3), {"A": 0.75, "B": 0.25}),
    ((0, 1, 2), (2, 3, 4, 5), {"A": 0.25, "B": 0.75}),
    ((2, 3), (2, 3, 4, 5), {"A": 0.0, "B": 1.0}),  # A has no prefill pod left
    ((2, 3), (3, 4, 5), {"B": 1.0}),
)
PER_STEP = 24
"""Requests each step serves once its shares are in place."""
SHARE = re.compile(
    r'^llm_d_epp_disaggregatedset_revision_gating_share\{mode="max-role",'
    r'plugin_name="rollout-screener",plugin_type="disaggregatedset-rollout-screener",'
    r'revision="(\w+)"\} (\S+)$',
    re.M,
)


@dataclass
class Served:
    step: int
    settled: bool
    """The step's shares were in place when the request was sent."""
    status: int
    headers: dict[str, str]


@dataclass
class Rollout:
    prefill_ports: list[int]
    decode_ports: list[int]
    step: int = 0
    settled: bool = False
    served: list[Served] = field(default_factory=list)

    def of_step(self, step: int) -> list[Served]:
        return [s for s in self.served if s.step == step and s.settled]

    def endpoints_file(self, step: int) -> str:
        """The pool at ``step``: each pod labelled with its role and its revision."""
        prefill, decode, _ = STEPS[step]
        pods = [("prefill", i, self.prefill_ports[i], PREFILL_REVISIONS[i]) for i in prefill]
        pods += [("decode", i, self.decode_ports[i], DECODE_REVISIONS[i]) for i in decode]
        lines = ["endpoints:"]
        for role, i, port, revision in pods:
            lines += [
                f"- name: {role}-{i}",
                "  address: 127.0.0.1",
                f"  port: '{port}'",
                "  labels:",
                f"    llm-d.ai/role: {role}",
                "    disaggregatedset.x-k8s.io/name: my-set",
                f"    {REV}: {revision}",
                f"    {ROLE}: {role}",
            ]
        return "\n".join(lines) + "\n"

    def revision_of(self, served: Served) -> str:
        """The revision of the pods that served a request, asserting that both pods agree."""
        h = served.headers
        assert served.status == 200, served
        assert h["x-sim-role"] == "decode", h
        decode = DECODE_REVISIONS[int(h["x-sim-pod"].removeprefix("pod-"))]
        prefill_port = int(h["x-sim-saw-prefiller"].removeprefix("127.0.0.1:"))
        prefill_index = self.prefill_ports.index(prefill_port)
        assert h["x-sim-prefill-pod"] == f"pod-{prefill_index}", h  # the leg ran on that pod
        prefill = PREFILL_REVISIONS[prefill_index]
        assert prefill == decode, f"step {served.step}: prefill {prefill} with decode {decode}"
        assert h["x-disagg-revision"] == decode  # the stamp names the served pod's revision
        return decode


async def shares(app: Any) -> dict[str, float]:
    return {r: float(v) for r, v in SHARE.findall(await metrics_text(app))}


async def apply_step(app: Any, rollout: Rollout, step: int) -> None:
    """Write the step's pool and wait until the gauge shows its shares (bounded)."""
    rollout.step, rollout.settled = step, False
    app.endpoints_file.write_text(rollout.endpoints_file(step))
    expected = STEPS[step][2]
    async with asyncio.timeout(30):
        while True:
            current = await shares(app)
            if current.keys() == expected.keys() and all(
                abs(current[r] - v) < 1e-9 for r, v in expected.items()
            ):
                break
            await asyncio.sleep(0.05)
    rollout.settled = True


async def traffic(url: str, rollout: Rollout, stop: asyncio.Event) -> None:
    while not stop.is_set():
        step, settled = rollout.step, rollout.settled
        status, headers, _ = await post(url, COMPLETION)
        rollout.served.append(Served(step, settled, status, headers))


async def test_a_rollout_never_pairs_revisions_and_the_share_follows_the_pods(
    start_app, sim_pods, envoy
) -> None:
    prefills = await sim_pods(len(PREFILL_REVISIONS), role="prefill")
    decodes = await sim_pods(len(DECODE_REVISIONS), role="decode")
    rollout = Rollout(prefills.ports, decodes.ports)
    app = await start_app(decodes.ports[:1], CONFIG, allow_experimental_plugins=True)
    proxy = envoy(app)
    url = f"{proxy.url}/v1/completions"
    await apply_step(app, rollout, 0)
    stop = asyncio.Event()
    workers = [asyncio.create_task(traffic(url, rollout, stop)) for _ in range(3)]
    try:
        for step in range(len(STEPS)):
            if step:
                await apply_step(app, rollout, step)
            await wait_for(lambda s=step: len(rollout.of_step(s)) >= PER_STEP, timeout=60)
        pinned = await strict_header_checks(url)
    finally:
        stop.set()
        await asyncio.gather(*workers)
    # Every request, mid-transition included, was served by one revision's pods.
    for served in rollout.served:
        rollout.revision_of(served)
    by_step = [
        Counter(rollout.revision_of(s) for s in rollout.of_step(step)) for step in range(len(STEPS))
    ]
    assert [set(c) for c in by_step] == [{"A"}, {"A"}, {"A", "B"}, {"A", "B"}, {"B"}, {"B"}]
    assert by_step[2]["A"] > by_step[2]["B"] and by_step[3]["B"] > by_step[3]["A"]
    assert pinned == (200, "B", 503)
    assert len(rollout.served) >= PER_STEP * len(STEPS)


async def strict_header_checks(url: str) -> tuple[int, str, int]:
    """At the last step only B is left: pinning B routes there, pinning A fails closed."""
    status_b, headers_b, _ = await post(url, COMPLETION, headers={"x-disagg-revision": "B"})
    status_a, _, _ = await post(url, COMPLETION, headers={"x-disagg-revision": "A"})
    return status_b, headers_b.get("x-disagg-revision", ""), status_a


SLICES = """\
    plugins:
    - type: disaggregatedset-rollout-screener
      parameters:
        scope: {labelSelector: "disaggregatedset.x-k8s.io/name=my-set"}
        headerSelectors:
        - {name: slice, headerName: x-disagg-slice,
           labelKey: disaggregatedset.x-k8s.io/slice, mode: prefer}
        revisionGating: {mode: max-role, requireRoles: {values: [prefill, decode]}}
    - type: header-label-affinity-scorer
      name: slice-affinity
      parameters: {headerName: x-disagg-slice, labelKey: disaggregatedset.x-k8s.io/slice}
    - type: queue-scorer
    - type: prefill-filter
    - type: decode-filter
    - type: max-score-picker
    - type: always-disagg-pd-decider
    - type: disagg-profile-handler
      parameters:
        deciders: {prefill: always-disagg-pd-decider}
    schedulingProfiles:
    - name: prefill
      plugins:
      - pluginRef: prefill-filter
      - {pluginRef: slice-affinity, weight: 3}
      - pluginRef: queue-scorer
      - pluginRef: max-score-picker
    - name: decode
      plugins:
      - pluginRef: decode-filter
      - {pluginRef: slice-affinity, weight: 3}
      - pluginRef: queue-scorer
      - pluginRef: max-score-picker
    """


async def test_a_slice_header_keeps_prefill_and_decode_in_its_slice(
    start_app, sim_pods, envoy
) -> None:
    prefills = await sim_pods(2, role="prefill")
    decodes = await sim_pods(2, role="decode")
    labels = {}
    for i, role in enumerate(("prefill", "prefill", "decode", "decode")):
        labels[i] = {
            "llm-d.ai/role": role,
            "disaggregatedset.x-k8s.io/name": "my-set",
            REV: "A",
            ROLE: role,
            "disaggregatedset.x-k8s.io/slice": str(i % 2),
        }
    app = await start_app(
        [*prefills.ports, *decodes.ports], SLICES, labels=labels, allow_experimental_plugins=True
    )
    url = f"{envoy(app).url}/v1/completions"
    for slice_ in (1, 0, 1):
        for _ in range(3):
            status, h, _ = await post(url, COMPLETION, headers={"x-disagg-slice": str(slice_)})
            assert status == 200
            assert h["x-sim-pod"] == f"pod-{slice_}"  # the decode pod of that slice
            assert h["x-sim-saw-prefiller"] == f"127.0.0.1:{prefills.ports[slice_]}"
            assert h["x-disagg-slice"] == str(slice_)  # stamped from the served pod
    status, h, _ = await post(url, COMPLETION, headers={"x-disagg-slice": "7"})
    assert status == 200 and h["x-disagg-slice"] in {"0", "1"}  # a preference, never a filter
