"""``epp --workers N``: N EPP processes on one host, one replica to everything outside.

One EPP process spends most of its CPU in grpc.aio's per-message cost and cannot use more than one
core. With ``--workers N`` (N > 1) the ``epp`` process becomes a supervisor that runs N workers,
each a normal ``App`` with the same settings, and answers for the group on the usual ports.
``--workers 1`` (the default) is the single process, unchanged: no supervisor is started.

- **ext_proc port (shared).** Every worker's gRPC server listens on ``--grpc-port`` with
  SO_REUSEPORT (grpcio sets ``grpc.so_reuseport``=1 by default on Linux; the supervisor holds the
  port with a non-listening SO_REUSEPORT socket, see ``preflight.reserve_port``). The kernel
  spreads *connections*, not requests, over the workers: a client that multiplexes every request
  on one HTTP/2 connection reaches one worker. Envoy opens one connection per worker thread; give
  the EPP cluster ``http2_protocol_options: {max_concurrent_streams: <small, e.g. 8>}`` so that
  concurrent requests open more connections, or ``common_http_protocol_options:
  {max_requests_per_connection: <n>}`` so that connections turn over.
- **Shared state (required).** The workers share routing facts through the cross-replica syncer
  (``dataLayer.crossReplicaSyncerPluginRef``, e.g. ``redis-syncer``); without one the supervisor
  refuses to start and says how to configure it (``preflight.require_syncer`` says why).
  ``--ha-enable-leader-election`` is refused with ``--workers`` above 1.
- **Health** (``--grpc-health-port``) is served by the supervisor (``policy.GroupHealth``):
  SERVING once every worker has been ready at once, then while at least one is; NOT_SERVING while
  draining; ``liveness`` SERVING while the supervisor runs. Each worker's own health server
  listens on an ephemeral private port, which the supervisor polls every 250 ms.
  ``--health-checking`` still adds health to the ext_proc port: that answer is the worker's own.
- **Metrics** (``--metrics-port``) are served by the supervisor: the union of the workers'
  pages, each sample labelled ``worker="<i>"``, with family names and help identical to a single
  process (``exposition``), plus ``llm_d_epp_worker_up`` and ``llm_d_epp_worker_restarts_total``.
  ``/debug/*`` is answered by one worker, named in the ``x-epp-worker`` header; ``?worker=<i>``
  picks it; ``/debug/workers`` lists the workers (``front``).
- **Restarts.** A worker that exits is started again after 0.5 s, doubling per further exit up
  to 10 s; the fifth exit within 60 s stops the group with an error (``policy.RestartPolicy``).
  A worker that refuses the configuration (exit 2) before the group was first ready stops the
  group with exit code 2.
- **Drain.** SIGTERM (or SIGINT) turns readiness off and sends SIGTERM to every worker; each
  drains as a single process does (readiness off, serves for ``--drain-timeout``, stops). A
  second signal is forwarded and cuts the drain short. Workers still running 10 s after the
  drain window are killed. Exit code 0 when every worker stopped cleanly, 1 when one failed or
  was killed, 2 when the configuration was refused.
- **TLS.** With ``--secure-serving`` and no ``--cert-path`` the supervisor makes one self-signed
  certificate for all workers.
- **Workers** are ``python -m epp _worker`` (``worker``; not in ``epp --help``), each in a
  session of its own; they get their settings as JSON on stdin and ``EPP_WORKER_INDEX`` /
  ``EPP_WORKERS`` in the environment (``spec``), report their ports on stdout, log to the shared
  stderr with ``[worker i]``, and stop on their own if the supervisor disappears.
"""
