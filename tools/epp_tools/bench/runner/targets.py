"""The routers under test. Each starts in front of a running simulated fleet and gives a URL.

==========  ===================================================================================
key         what runs
==========  ===================================================================================
``epp``     Envoy (``full-duplex`` config) + this EPP as its own process (``epp --config-file
            ... --secure-serving=false``): the built-in default config (what ``epp`` runs
            without ``--config-*``) with file discovery of the pods, plus the workload's extra
            scorers
``epp-buffered``  the ``epp`` target behind Envoy's ``buffered-failopen`` config
            (``deploy/envoy``): the request body BUFFERED, response headers and body not sent
            to the EPP, failing open to the pods; the request completes when its ext_proc stream
            ends. No message per response chunk, and so no usage, TTFT or Responses API ids
            from the response: what a deployment gives up for that CPU
``epp-streamed``  the ``epp`` target behind Envoy's ``streamed`` config (``epp envoy-config
            --body streamed``): the request body BUFFERED, the response body STREAMED, which
            the EPP switches off (``mode_override``) for an answer nothing needs
            (``epp.requestcontrol.bodyneed``)
``epp-sampled``  the ``epp`` target reading a tenth of the response bodies nothing needs
            (``--response-body-sample-ratio 0.1``; the ``epp`` target reads every one, the
            default); ``epp-streamed`` runs with that ratio too, or it would skip nothing
``epp-asyncio``  the ``epp`` target on the standard library's event loop (``--event-loop
            asyncio``; the ``epp`` target runs on uvloop, the default)
``rr``      Envoy alone, ``ROUND_ROBIN`` over the pods
``lr``      Envoy alone, ``LEAST_REQUEST`` over the pods
``sglang``  sglang-router ``cache_aware`` (see ``epp_tools.bench.peers.routers``)
``vllm``    vllm-router ``cache_aware``
``epp-r2``  2 (to 8: ``epp-r<n>``) replicas of the ``epp`` target behind one Envoy, each
            learning only from its own traffic (Envoy balances ext_proc streams round-robin
            over the replicas its gRPC health check finds SERVING)
``epp-r2-redis``  the same replicas sharing what they learn through a local ``redis-server``
            (``redis-syncer``, 200 ms sync interval); unavailable without ``redis-server``
``epp-w2``  one ``epp --workers 2`` (to 8) group sharing through a local ``redis-server``;
            Envoy opens a further connection per 4 concurrent streams, so that the kernel
            spreads them over the workers
``epp-pd``  Envoy + this EPP with ``deploy/configs/pd.yaml`` (``epp-pd:<config.yaml>``: that P/D
            config), on the workload's P/D fleet: the same pods with the roles of
            ``Workload.pd_roles``, labelled ``llm-d.ai/role`` in the endpoints file. Not in the
            default list: a workload that has a P/D fleet adds it (``Workload.extra_targets``);
            on a workload without one it is skipped. When a plugin type of its config cannot be
            loaded (e.g. the P/D plugins are not installed yet) it is skipped with that reason.
==========  ===================================================================================

``Running.processes`` names the PIDs whose CPU time and peak RSS the report shows (the EPP and
its Envoy, Envoy alone, or the peer router; each replica and the Redis of a replica set; a
``--workers`` group's CPU includes its workers). An EPP target also gives its metrics URL and the
config it runs; when the workload declares InferenceObjectives they are written to
``objectives.yaml`` in the target's work directory and passed with ``--objectives-file``. A
config that already has a ``file-discovery`` plugin (the files under ``deploy/configs/``) gets
its path pointed at the run's endpoints file; ``epp:<config.yaml>`` runs with
``--allow-experimental-plugins``, so such a config may use alpha plugins.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from epp_tools.bench.fleet import SimProcess, endpoints_yaml
from epp_tools.bench.peers.routers import (
    SGLANG,
    VLLM,
    PeerSpec,
    ensure_installed,
    no_egress_env,
    repo_root,
)
from epp_tools.bench.workloads.spec import FleetSpec, Workload
from epp_tools.stack.envoy import Envoy, free_port
from epp_tools.stack.eppconfig import PD_CONFIG, epp_config_text, unloadable_plugins
from epp_tools.stack.procs import Proc, wait_http
from epp_tools.stack.redis import INSTALL_HINT as REDIS_HINT
from epp_tools.stack.redis import available as redis_available
from epp_tools.stack.replicas import EppSet, SetupError

TARGETS: dict[str, str] = {
    "epp": "EPP (default config) via Envoy",
    "rr": "Envoy round robin",
    "lr": "Envoy least request",
    "sglang": SGLANG.label,
    "vllm": VLLM.label,
}
PEERS: dict[str, PeerSpec] = {"sglang": SGLANG, "vllm": VLLM}
BUFFERED: dict[str, str] = {
    "epp-buffered": "EPP via Envoy, buffered (no response messages)",
}
"""EPP targets behind Envoy's buffered config, no ext_proc message per response chunk; named on
the command line only (not in the default list)."""
STREAMED: dict[str, str] = {
    "epp-streamed": "EPP via Envoy, streamed (unneeded response bodies switched off)",
}
SAMPLED: dict[str, str] = {"epp-sampled": "EPP via Envoy, a tenth of unneeded bodies read"}
ASYNCIO: dict[str, str] = {"epp-asyncio": "EPP via Envoy, on asyncio's own event loop"}
NAMED_ONLY: dict[str, str] = {**BUFFERED, **STREAMED, **SAMPLED, **ASYNCIO}
"""The targets named on the command line only (not in the default list)."""
PD_TARGET = "epp-pd"
REPLICA_KEY = re.compile(r"epp-(r([2-8])(-redis)?|w([2-8]))")
"""``epp-r<n>``: n replicas learning alone; ``epp-r<n>-redis``: sharing through Redis;
``epp-w<n>``: one ``epp --workers n`` group (sharing through Redis)."""
WORKER_STREAMS = 4
"""Concurrent ext_proc streams per Envoy connection to an ``epp --workers`` group: past it Envoy
opens another connection, which the kernel may give to another worker."""


@dataclass(frozen=True)
class ReplicaShape:
    replicas: int = 1
    shared: bool = False
    workers: int = 1


def replica_shape(key: str) -> ReplicaShape:
    m = REPLICA_KEY.fullmatch(key)
    if m is None:
        return ReplicaShape()
    if m.group(4):
        return ReplicaShape(workers=int(m.group(4)), shared=True)
    return ReplicaShape(replicas=int(m.group(2)), shared=bool(m.group(3)))


class TargetUnavailable(Exception):
    """The target cannot run here (e.g. its config names plugins that do not load)."""


@dataclass
class Running:
    url: str
    processes: dict[str, int]
    stops: list[Callable[[], None]] = field(default_factory=list)
    metrics_url: str = ""
    config_text: str = ""

    def stop(self) -> None:
        for stop in reversed(self.stops):
            stop()
        self.stops.clear()


def is_pd(key: str) -> bool:
    """Whether ``key`` is a P/D target (``epp-pd`` or ``epp-pd:<config.yaml>``)."""
    return key == PD_TARGET or key.startswith(PD_TARGET + ":")


def pd_config(key: str) -> Path:
    return Path(key[len(PD_TARGET) + 1 :]) if ":" in key else PD_CONFIG


def label(key: str) -> str:
    """Display name of a target; ``epp:<config.yaml>`` is the EPP with that config."""
    shape = replica_shape(key)
    if shape.workers > 1:
        return f"EPP --workers {shape.workers} via Envoy"
    if shape.replicas > 1:
        how = "sharing via Redis" if shape.shared else "learning alone"
        return f"EPP x{shape.replicas} replicas {how}"
    if is_pd(key):
        return f"EPP ({pd_config(key).stem}) via Envoy, P/D fleet"
    if key.startswith("epp:"):
        return f"EPP ({Path(key[4:]).stem}) via Envoy"
    return NAMED_ONLY[key] if key in NAMED_ONLY else TARGETS[key]


def is_known(key: str) -> bool:
    if key == PD_TARGET or REPLICA_KEY.fullmatch(key):
        return True
    if key.startswith(("epp:", PD_TARGET + ":")):
        return Path(key.split(":", 1)[1]).is_file()
    return key in TARGETS or key in NAMED_ONLY


def fleet_spec(key: str, workload: Workload) -> FleetSpec:
    """The fleet target ``key`` runs on: the P/D fleet for a P/D target, else the workload's."""
    if not is_pd(key):
        return workload.fleet
    if workload.pd_fleet is None:
        raise TargetUnavailable(f"workload ({workload.name}) has no P/D fleet")
    return workload.pd_fleet


def _start_epp(
    fleet: SimProcess,
    workload: Workload,
    workdir: Path,
    base: str | None = None,
    key: str = "epp",
    env: Mapping[str, str] | None = None,
) -> Running:
    eps = workdir / "endpoints.yaml"
    eps.write_text(endpoints_yaml(fleet))
    config_text = epp_config_text(eps, workload.epp_extra_scorers, base)
    args: list[str] = []
    if key in SAMPLED or key in STREAMED:
        args += ["--response-body-sample-ratio", "0.1"]
    if key in ASYNCIO:
        args += ["--event-loop", "asyncio"]
    if base is not None:  # a config given on the command line may use alpha plugins
        args.append("--allow-experimental-plugins")
    if workload.objectives:
        objectives = workdir / "objectives.yaml"
        objectives.write_text(workload.objectives_yaml())
        args += ["--objectives-file", str(objectives)]
    shape = replica_shape(key)
    group = EppSet(
        workdir,
        config_text,
        replicas=shape.replicas,
        shared=shape.shared,
        workers=shape.workers,
        extra_args=args,
        envoy_max_streams=WORKER_STREAMS if shape.workers > 1 else 0,
        envoy_route_timeout=workload.gateway_timeout,
        env=dict(env or {}),
    )
    if key in BUFFERED:
        group.envoy_config = "buffered-failopen"
        group.fallback = fleet.hostports
    if key in STREAMED:
        group.envoy_config = "streamed"
    try:
        group.start()
    except SetupError as exc:
        raise TargetUnavailable(str(exc)) from None
    return Running(group.url, group.pids(), [group.stop], group.metrics_url(0), config_text)


def _start_envoy(fleet: SimProcess, lb_policy: str, route_timeout: float) -> Running:
    envoy = Envoy(
        "round-robin", fallback=fleet.hostports, lb_policy=lb_policy, route_timeout=route_timeout
    ).start()
    return Running(envoy.url, {"envoy": envoy.proc.pid if envoy.proc else 0}, [envoy.stop])


def _start_peer(spec: PeerSpec, fleet: SimProcess, workdir: Path) -> Running:
    root = repo_root()
    port = free_port()
    argv = spec.argv(root, port, free_port(), fleet.urls)
    proc = Proc(spec.key, argv, workdir / f"{spec.key}.log", env=no_egress_env()).start()
    running = Running(f"http://127.0.0.1:{port}", {spec.key: proc.pid}, [proc.stop])
    try:
        wait_http(f"{running.url}/health", proc, timeout=60)
    except BaseException:
        running.stop()
        raise
    return running


def prepare(key: str) -> None:
    """Install what the target needs (peers: their venv); raises ``PeerUnavailable``, or
    ``TargetUnavailable`` for a P/D target whose config does not load here."""
    if key in PEERS:
        ensure_installed(PEERS[key], repo_root())
    if replica_shape(key).shared and not redis_available():
        raise TargetUnavailable(REDIS_HINT)
    if is_pd(key):
        missing = unloadable_plugins(pd_config(key).read_text())
        if missing:
            raise TargetUnavailable(
                f"{pd_config(key).name} needs plugin types that are not available here yet: "
                + ", ".join(missing)
            )


def start(
    key: str,
    fleet: SimProcess,
    workload: Workload,
    workdir: Path,
    epp_env: Mapping[str, str] | None = None,
) -> Running:
    """Start target ``key`` on ``fleet``; ``epp_env``: extra environment of EPP processes."""
    workdir.mkdir(parents=True, exist_ok=True)
    if key in ("epp", *NAMED_ONLY) or REPLICA_KEY.fullmatch(key):
        return _start_epp(fleet, workload, workdir, key=key, env=epp_env)
    if key.startswith("epp:"):
        return _start_epp(fleet, workload, workdir, Path(key[4:]).read_text(), env=epp_env)
    if is_pd(key):
        return _start_epp(fleet, workload, workdir, pd_config(key).read_text(), env=epp_env)
    if key == "rr":
        return _start_envoy(fleet, "ROUND_ROBIN", workload.gateway_timeout)
    if key == "lr":
        return _start_envoy(fleet, "LEAST_REQUEST", workload.gateway_timeout)
    if key in PEERS:
        return _start_peer(PEERS[key], fleet, workdir)
    raise ValueError(f"unknown target {key!r} (known: {', '.join(TARGETS)})")
