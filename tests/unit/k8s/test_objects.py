"""InferenceObjective / InferenceModelRewrite: decoding, rewrite resolution, files, merging."""

from __future__ import annotations

import datetime
import random
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from epp.k8s.files import ObjectFiles, ObjectsFileError, parse_objects
from epp.k8s.meta import DecodeError, PoolRef
from epp.k8s.objectives import decode_objective, priorities
from epp.k8s.rewrites import decode_rewrite
from epp.k8s.sink import ObjectSink
from epp.k8s.source import deployment_name
from epp.requestcontrol.objectives import ObjectiveStore
from epp.requestcontrol.rewrites import (
    ModelRewrite,
    RewriteDecision,
    RewriteRule,
    RewriteStore,
    RewriteTarget,
)
from epp_tools.bench.kube.objects import objective, rewrite

T0 = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)


def rule(models: tuple[str, ...], *targets: tuple[str, int | None]) -> RewriteRule:
    return RewriteRule(models, tuple(RewriteTarget(m, w) for m, w in targets))


def rw(name: str, *rules: RewriteRule, days: int | None = 0, order: int = 0) -> ModelRewrite:
    created = None if days is None else T0 + datetime.timedelta(days=days)
    return ModelRewrite(name, rules, created=created, order=order)


# ---- rewrite resolution ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rewrites", "model", "expected"),
    [
        pytest.param([], "m", None, id="no-rewrites"),
        pytest.param(
            [
                rw("generic", rule((), ("g", None)), days=0),
                rw("exact", rule(("m",), ("e", None)), days=5),
            ],
            "m",
            RewriteDecision("exact", "e"),
            id="exact-beats-older-generic",
        ),
        pytest.param(
            [rw("generic", rule((), ("g", None)))],
            "other",
            RewriteDecision("generic", "g"),
            id="generic-catches-the-rest",
        ),
        pytest.param(
            [
                rw("new", rule(("m",), ("n", None)), days=9),
                rw("old", rule(("m",), ("o", None)), days=1),
            ],
            "m",
            RewriteDecision("old", "o"),
            id="oldest-object-wins",
        ),
        pytest.param(
            [rw("one", rule(("x", "m"), ("first", None)), rule(("m",), ("second", None)))],
            "m",
            RewriteDecision("one", "first"),
            id="first-rule-within-an-object",
        ),
        pytest.param(
            [
                rw("cluster", rule(("m",), ("c", None))),
                rw("file", rule(("m",), ("f", None)), days=None),
            ],
            "m",
            RewriteDecision("file", "f"),
            id="untimestamped-file-object-ranks-oldest",
        ),
        pytest.param(
            [rw("w", rule(("m",), ("never", None), ("always", 5)))],
            "m",
            RewriteDecision("w", "always"),
            id="unweighted-target-never-drawn-beside-weighted",
        ),
    ],
)
def test_rewrite_resolves_by_precedence_when_rules_compete(
    rewrites: list[ModelRewrite], model: str, expected: RewriteDecision | None
) -> None:
    store = RewriteStore(rewrites)
    assert [store.resolve(model, random.Random(s)) for s in range(20)] == [expected] * 20


@pytest.mark.parametrize(
    ("targets", "shares"),
    [
        pytest.param([("a", 90), ("b", 10)], {"a": 0.9, "b": 0.1}, id="90-10"),
        pytest.param([("a", 1), ("b", 1), ("c", 2)], {"a": 0.25, "b": 0.25, "c": 0.5}, id="1-1-2"),
        pytest.param([("a", None), ("b", None)], {"a": 0.5, "b": 0.5}, id="uniform-unweighted"),
    ],
)
def test_targets_are_drawn_by_weight_when_a_rule_splits_traffic(
    targets: list[tuple[str, int | None]], shares: dict[str, float]
) -> None:
    store = RewriteStore([rw("split", rule(("m",), *targets))])
    rng = random.Random(11)
    n = 20_000
    counts = Counter(d.target_model for d in (store.resolve("m", rng) for _ in range(n)) if d)
    for model, share in shares.items():
        assert abs(counts[model] / n - share) < 0.015


# ---- decoding ----------------------------------------------------------------------------------


def test_rewrite_decodes_when_shaped_as_the_crd() -> None:
    raw = rewrite(
        "canary",
        "pool",
        [
            {
                "matches": [{"model": {"type": "Exact", "value": "m"}}],
                "targets": [{"modelRewrite": "a", "weight": 9}],
            },
            {"targets": [{"modelRewrite": "b"}]},
        ],
        created="2025-03-04T05:06:07Z",
    )
    ref, decoded = decode_rewrite(raw)
    assert ref == PoolRef("pool")
    assert decoded == ModelRewrite(
        "canary",
        (rule(("m",), ("a", 9)), rule((), ("b", None))),
        created=datetime.datetime(2025, 3, 4, 5, 6, 7, tzinfo=datetime.UTC),
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param({"rules": []}, "spec.poolRef: required", id="no-pool-ref"),
        pytest.param(
            {"poolRef": {"name": "p"}, "rules": [{"targets": []}]}, "at least one", id="no-targets"
        ),
        pytest.param(
            {
                "poolRef": {"name": "p"},
                "rules": [{"targets": [{"modelRewrite": "a", "weight": 0}]}],
            },
            "out of range 1..1000000",
            id="zero-weight",
        ),
        pytest.param(
            {
                "poolRef": {"name": "p"},
                "rules": [
                    {
                        "matches": [{"model": {"type": "Regex", "value": "a"}}],
                        "targets": [{"modelRewrite": "a"}],
                    }
                ],
            },
            "only Exact",
            id="regex",
        ),
        pytest.param(
            {"poolRef": {"name": "p"}, "rules": [{"targets": [{"weight": 3}]}]},
            "modelRewrite: required",
            id="no-target-model",
        ),
    ],
)
def test_rewrite_decode_fails_when_the_spec_is_invalid(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode_rewrite({"metadata": {"name": "r"}, "spec": spec})


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(objective("o", "pool", 4), 4, id="priority"),
        pytest.param(objective("o", "pool"), None, id="unset"),
        pytest.param(objective("o", "pool", -2), -2, id="sheddable"),
    ],
)
def test_objective_decodes_when_shaped_as_the_crd(
    raw: dict[str, Any], expected: int | None
) -> None:
    decoded = decode_objective(raw)
    assert (decoded.name, decoded.priority, decoded.pool_ref) == ("o", expected, PoolRef("pool"))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param({"priority": 1}, "spec.poolRef: required", id="no-pool-ref"),
        pytest.param({"priority": "high", "poolRef": {"name": "p"}}, "integer", id="type"),
        pytest.param({"priority": 2**31, "poolRef": {"name": "p"}}, "range", id="int32"),
        pytest.param({"poolRef": {}}, "poolRef.name", id="ref-name"),
    ],
)
def test_objective_decode_fails_when_the_spec_is_invalid(
    spec: dict[str, Any], message: str
) -> None:
    with pytest.raises(DecodeError, match=message):
        decode_objective({"metadata": {"name": "o"}, "spec": spec})


def test_priorities_keep_only_this_pool_when_a_pool_is_named() -> None:
    objectives = [
        decode_objective(objective("mine", "pool", 3)),
        decode_objective(objective("theirs", "other", 5)),
        decode_objective(
            {"metadata": {"name": "local"}, "spec": {"priority": 1}}, require_pool_ref=False
        ),
    ]
    other_group = decode_objective(objective("grouped", "pool", 7))
    other_group = type(other_group)("grouped", "default", 7, PoolRef("pool", group="x.io"))
    objectives.append(other_group)
    assert priorities(objectives, "pool", "inference.networking.k8s.io") == {"mine": 3, "local": 1}
    assert priorities(objectives) == {"mine": 3, "theirs": 5, "local": 1, "grouped": 7}


# ---- files and merging ---------------------------------------------------------------------------

FILE = textwrap.dedent("""\
    apiVersion: v1
    kind: List
    items:
    - apiVersion: llm-d.ai/v1alpha2
      kind: InferenceObjective
      metadata: {name: a}
      spec: {priority: 2}
    ---
    apiVersion: llm-d.ai/v1alpha2
    kind: InferenceModelRewrite
    metadata: {name: r}
    spec:
      poolRef: {name: other-pool}
      rules: [{targets: [{modelRewrite: x}]}]
    """)


def test_objects_parse_when_the_file_mixes_lists_and_documents() -> None:
    parsed = parse_objects(FILE.encode(), "f.yaml", first_order=10)
    assert [(o.name, o.priority) for o in parsed.objectives] == [("a", 2)]
    ((ref, parsed_rewrite),) = parsed.rewrites
    assert ref == PoolRef("other-pool")
    assert (parsed_rewrite.name, parsed_rewrite.order, parsed_rewrite.created) == ("r", 11, None)


def test_objects_file_error_names_the_object_when_one_is_invalid() -> None:
    bad = FILE.replace("priority: 2", "priority: [2]")
    with pytest.raises(ObjectsFileError, match=r"f.yaml: object 0: InferenceObjective default/a"):
        parse_objects(bad.encode(), "f.yaml")


def test_files_reload_only_when_their_content_changed(tmp_path: Path) -> None:
    path = tmp_path / "objects.yaml"
    path.write_text(FILE)
    published: list[Any] = []
    files = ObjectFiles([str(path)], published.append)
    files.load()
    assert files.poll_once() is None  # unchanged
    path.write_text(FILE)  # same content, new mtime
    assert files.poll_once() is None
    path.write_text(FILE.replace("priority: 2", "priority: 3"))
    reloaded = files.poll_once()
    assert reloaded is not None
    assert reloaded.objectives[0].priority == 3
    path.write_text("kind: Broken\n")
    assert files.poll_once() is None  # kept the previous objects
    assert len(published) == 1  # load() publishes; poll_once() leaves publishing to run()


def test_sink_merges_cluster_and_files_when_both_declare_objects() -> None:
    objectives, rewrites = ObjectiveStore(), RewriteStore()
    sink = ObjectSink(
        objectives, rewrites, pool_name="pool", pool_group="inference.networking.k8s.io"
    )
    sink.set_cluster_objectives(
        [decode_objective(objective("a", "pool", 1)), decode_objective(objective("b", "pool", 5))]
    )
    sink.set_cluster_rewrites(
        [decode_rewrite(rewrite("c", "pool", [{"targets": [{"modelRewrite": "z"}]}]))]
    )
    sink.set_files(parse_objects(FILE.encode()))
    assert objectives.snapshot() == {"a": 2, "b": 5}  # the file's "a" overrides the cluster's
    assert [r.name for r in rewrites.rewrites()] == ["c"]  # the file's rewrite is another pool's


@pytest.mark.parametrize(
    ("pod_name", "expected"),
    [
        pytest.param("vllm-epp-7d4b9c8f6-x2x9k", "vllm-epp", id="deployment-pod"),
        pytest.param("router-abc12-zzz", "router", id="short"),
        pytest.param("standalone", "standalone", id="bare"),
    ],
)
def test_standalone_pool_is_named_after_the_deployment_when_derived(
    pod_name: str, expected: str
) -> None:
    assert deployment_name(pod_name) == expected
