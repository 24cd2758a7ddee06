"""``--objectives-file``: objectives and rewrites without Kubernetes (file discovery), reloaded."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from epp.app import App
from epp.config.loader import ConfigError
from tests.conftest import dead_ports, endpoints_yaml, epp_config, make_settings, wait_for

OBJECTS = textwrap.dedent("""\
    apiVersion: llm-d.ai/v1alpha2
    kind: InferenceObjective
    metadata: {name: interactive}
    spec: {priority: 10}
    ---
    apiVersion: inference.networking.x-k8s.io/v1alpha2
    kind: InferenceObjective
    metadata: {name: batch}
    spec: {priority: -1}
    ---
    apiVersion: llm-d.ai/v1alpha2
    kind: InferenceModelRewrite
    metadata: {name: alias}
    spec:
      rules:
      - matches: [{model: {type: Exact, value: llama}}]
        targets: [{modelRewrite: llama-3.1-8b}]
    """)


def settings(tmp_path: Path, *files: Path, **kw: Any) -> Any:
    eps = tmp_path / "endpoints.yaml"
    eps.write_text(endpoints_yaml(dead_ports(1)))
    return make_settings(
        epp_config(eps),
        objectives_files=tuple(str(f) for f in files),
        objectives_poll_interval=0.05,
        **kw,
    )


async def target(app: App, model: str) -> str:
    request = app.director.new_request({":path": "/v1/completions"})
    body = json.dumps({"model": model, "prompt": "hi"}).encode()
    await app.director.decide(request, body, {})
    return request.target_model


async def test_objects_apply_and_reload_when_the_file_changes(tmp_path: Path) -> None:
    objects = tmp_path / "objects.yaml"
    objects.write_text(OBJECTS)
    async with App(settings(tmp_path, objects)) as app:
        await app.wait_ready()
        header = "x-llm-d-inference-objective"
        assert app.director.new_request({header: "interactive"}).priority == 10
        assert app.director.new_request({header: "batch"}).priority == -1
        assert await target(app, "llama") == "llama-3.1-8b"
        objects.write_text(OBJECTS.replace("priority: 10", "priority: 4").split("---")[0])
        await wait_for(lambda: app.director.new_request({header: "interactive"}).priority == 4)
        assert app.director.new_request({header: "batch"}).priority == 0
        assert await target(app, "llama") == "llama"
        objects.write_text("kind: Nonsense\n")  # broken on reload: the previous objects stay
        await wait_for(
            lambda: app.object_files is not None and app.object_files.poll_once() is None
        )
        assert app.director.new_request({header: "interactive"}).priority == 4


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param("kind: Pod\napiVersion: v1\n", "unsupported object 'v1' 'Pod'", id="kind"),
        pytest.param(
            "apiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nmetadata: {name: x}\n"
            "spec: {priority: high}\n",
            "spec.priority: expected an integer",
            id="priority-type",
        ),
        pytest.param("a: [1\n", "not valid YAML", id="yaml"),
    ],
)
def test_startup_fails_when_the_objects_file_is_invalid(
    tmp_path: Path, content: str, message: str
) -> None:
    objects = tmp_path / "objects.yaml"
    objects.write_text(content)
    with pytest.raises(ConfigError, match="--objectives-file") as info:
        App(settings(tmp_path, objects))
    assert message in str(info.value)
