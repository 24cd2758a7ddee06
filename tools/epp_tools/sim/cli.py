"""``epp sim``: run K simulated vLLM (or SGLang) pods in one process.

Example::

    epp sim --model meta-llama/Llama-3.1-8B-Instruct --pods 4 --port 8000 --time-scale 10 \\
        --lora sql-lora,tweet-lora --max-loras 2 --kv-events-endpoint 'tcp://*:5557'

serves pods ``sim-0`` .. ``sim-3`` on ports 8000..8003, pod i publishing KV events on port
5557 + i. Prints ``sim pod <name> listening on http://<host>:<port>`` per pod once ready; on
SIGTERM / SIGINT it stops accepting connections, lets the requests it serves finish (up to 2 s)
and exits. ``--pod-num-gpu-blocks 28000,28000,28000,11200`` gives each
pod its own KV capacity and ``--pod-role prefill,decode,decode,decode`` its own P/D role (one
value per pod; every other setting is shared). ``--role`` sets the role of every pod (``both``,
``prefill`` or ``decode``, see ``tools/epp_tools/sim/disagg.py``); ``--kv-transfer-ms-per-block`` is
the time a decode pod takes to pull one KV block from a prefill pod.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence

from epp_tools.sim.config import (
    ENGINE_KINDS,
    ROLES,
    PodConfig,
    Role,
    endpoint_binds,
    offset_endpoint_port,
)
from epp_tools.sim.fleet import SimFleet

_D = PodConfig()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="epp sim",
        description="vLLM-compatible model-server simulator (many pods in one process).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="Engine defaults are shaped like an 8B model served by vLLM on one H100 80 GB "
        "(see tools/epp_tools/sim/config.py for where each number comes from). Test control: "
        "POST /sim/overrides, POST /sim/faults, GET /sim/stats (see "
        "tools/epp_tools/sim/control.py).",
    )
    p.add_argument("--host", default=_D.host, help="listen address of every pod")
    p.add_argument("--port", type=int, default=8000, help="port of pod 0; pod i uses port + i")
    p.add_argument("--pods", type=int, default=1, help="number of pods")
    p.add_argument("--pod-name-prefix", default="sim-", help="pod i is named <prefix><i>")
    p.add_argument("--model", default=_D.model, help="served (base) model name")
    p.add_argument("--engine", choices=ENGINE_KINDS, default=_D.engine, help="metric naming")
    p.add_argument("--lora", default="", help="comma-separated LoRA adapter names")
    p.add_argument("--max-loras", type=int, default=_D.max_loras, help="LoRA slots per batch")
    _engine_options(p)
    _pd_options(p)
    p.add_argument(
        "--kv-events-endpoint",
        default=None,
        help="ZMQ endpoint of vLLM KV events (bind if it has '*', else connect); pod i: port + i",
    )
    p.add_argument(
        "--kv-events-shared",
        action="store_true",
        help="in connect mode, let every pod connect to the same endpoint (one bound indexer)",
    )
    p.add_argument(
        "--responses-cache-size",
        type=int,
        default=_D.responses_cache_size,
        help="stored Responses API turns per pod (LRU)",
    )
    p.add_argument("--seed", type=int, default=_D.seed, help="seed of the fault injector")
    return p


def _engine_options(p: argparse.ArgumentParser) -> None:
    """The engine model of every pod: cache, batch, speeds."""
    p.add_argument("--block-size", type=int, default=_D.block_size, help="tokens per KV block")
    p.add_argument("--num-gpu-blocks", type=int, default=_D.num_gpu_blocks, help="KV blocks")
    p.add_argument(
        "--pod-num-gpu-blocks",
        default="",
        help="comma-separated KV blocks of each pod (one per pod), overriding --num-gpu-blocks",
    )
    p.add_argument("--max-num-seqs", type=int, default=_D.max_num_seqs, help="max batch size")
    p.add_argument("--max-model-len", type=int, default=_D.max_model_len, help="context window")
    p.add_argument(
        "--prefill-tokens-per-s",
        type=float,
        default=_D.prefill_tokens_per_s,
        help="prefill throughput for uncached prompt tokens",
    )
    p.add_argument(
        "--decode-base-ms", type=float, default=_D.decode_base_ms, help="decode step, fixed part"
    )
    p.add_argument(
        "--decode-per-seq-ms",
        type=float,
        default=_D.decode_per_seq_ms,
        help="decode step, added per running sequence",
    )
    p.add_argument(
        "--default-max-tokens",
        type=int,
        default=_D.default_max_tokens,
        help="output length of chat/responses requests without a limit",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=_D.time_scale,
        help="simulation speed-up (10 = ten times faster than real time)",
    )


def _pd_options(p: argparse.ArgumentParser) -> None:
    """Disaggregated prefill/decode: the pods' roles and the KV transfer cost."""
    p.add_argument("--role", choices=ROLES, default=_D.role, help="P/D role of every pod")
    p.add_argument(
        "--pod-role",
        default="",
        help="comma-separated P/D role of each pod (one per pod), overriding --role",
    )
    p.add_argument(
        "--kv-transfer-ms-per-block",
        type=float,
        default=_D.kv_transfer_ms_per_block,
        help="simulated ms a decode pod takes to pull one KV block from a prefill pod",
    )
    p.add_argument(
        "--bos-token-id",
        type=int,
        default=None,
        help="token id prepended to text completion prompts (default: none, like the estimate)",
    )


def configs_from_args(args: argparse.Namespace) -> list[PodConfig]:
    if args.pods < 1:
        raise ValueError("--pods must be >= 1")
    if args.port + args.pods - 1 > 65535 or args.port < 0:
        raise ValueError("--port + --pods exceeds the port range")
    loras = tuple(name.strip() for name in args.lora.split(",") if name.strip())
    blocks = _pod_blocks(args.pod_num_gpu_blocks, args.pods, args.num_gpu_blocks)
    roles = _pod_roles(args.pod_role, args.pods, args.role)
    configs: list[PodConfig] = []
    for i in range(args.pods):
        endpoint = args.kv_events_endpoint
        if endpoint and not (args.kv_events_shared and not endpoint_binds(endpoint)):
            endpoint = offset_endpoint_port(endpoint, i)
        configs.append(
            PodConfig(
                name=f"{args.pod_name_prefix}{i}",
                host=args.host,
                port=args.port + i if args.port else 0,
                model=args.model,
                engine=args.engine,
                lora_adapters=loras,
                max_loras=args.max_loras,
                block_size=args.block_size,
                num_gpu_blocks=blocks[i],
                max_num_seqs=args.max_num_seqs,
                max_model_len=args.max_model_len,
                prefill_tokens_per_s=args.prefill_tokens_per_s,
                decode_base_ms=args.decode_base_ms,
                decode_per_seq_ms=args.decode_per_seq_ms,
                default_max_tokens=args.default_max_tokens,
                time_scale=args.time_scale,
                kv_events_endpoint=endpoint,
                responses_cache_size=args.responses_cache_size,
                seed=args.seed + i,
                role=roles[i],
                kv_transfer_ms_per_block=args.kv_transfer_ms_per_block,
                bos_token_id=args.bos_token_id,
            )
        )
    return configs


def _pod_blocks(text: str, pods: int, default: int) -> list[int]:
    """KV blocks of each pod: the comma-separated list, or ``default`` for every pod."""
    if not text.strip():
        return [default] * pods
    try:
        blocks = [int(v) for v in text.split(",")]
    except ValueError:
        raise ValueError("--pod-num-gpu-blocks must be comma-separated integers") from None
    if len(blocks) != pods:
        raise ValueError(f"--pod-num-gpu-blocks has {len(blocks)} values for {pods} pods")
    return blocks


def _pod_roles(text: str, pods: int, default: Role) -> list[Role]:
    """P/D role of each pod: the comma-separated list, or ``default`` for every pod."""
    if not text.strip():
        return [default] * pods
    roles = [v.strip() for v in text.split(",")]
    if len(roles) != pods:
        raise ValueError(f"--pod-role has {len(roles)} values for {pods} pods")
    out: list[Role] = []
    for role in roles:
        if role not in ROLES:
            raise ValueError(f"--pod-role: {role!r} is not one of {', '.join(ROLES)}")
        out.append(role)
    return out


async def serve(configs: Sequence[PodConfig]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with SimFleet(configs) as fleet:
            for config, url in zip(fleet.configs, fleet.urls, strict=True):
                print(f"sim pod {config.name} listening on {url}", flush=True)
            await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        configs = configs_from_args(args)
    except ValueError as exc:
        parser.print_usage(sys.stderr)
        print(f"epp sim: error: {exc}", file=sys.stderr)
        return 2
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(configs))
    except OSError as exc:
        print(f"epp sim: {exc}", file=sys.stderr)
        return 1
    return 0
