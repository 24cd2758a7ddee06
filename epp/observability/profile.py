"""``--enable-pprof``: a CPU profile of the event loop, Python's answer to Go's
``/debug/pprof/profile``, with Go's index page and command line.

``GET /debug/pprof/`` (``/debug/pprof`` redirects there, as Go's mux does) answers, like Go's
``net/http/pprof`` index, with an HTML page listing the profiles served here, each linked, with
its description: ``cmdline`` and ``profile``. ``GET /debug/pprof/cmdline`` answers with this
process's command line, its arguments separated by NUL bytes (``text/plain``), as Go's.

``GET /debug/pprof/profile?seconds=N`` profiles the App's event-loop thread (where every request,
plugin and background task of the App runs) with ``cProfile`` for ``N`` seconds (default 30, 1 to
``MAX_SECONDS``) and answers with the ``pstats`` file (``application/octet-stream``; open it with
``python -m pstats`` or snakeviz); ``&format=text`` answers with the top ``TEXT_ROWS`` functions
by cumulative time instead. Its clock is the wall clock (``&clock=wall``, the default): a
function's time includes what it waited, and on a busy machine the time the process was not
scheduled. The event loop's own idle wait is among them on asyncio's loop (``--event-loop
asyncio``: its ``epoll`` call is a function the profiler sees) but not on uvloop, the default,
which waits inside libuv: there the profile's total is the time spent in the loop's callbacks.
``&clock=cpu`` counts the loop thread's CPU time instead (``time.thread_time``), as Go's CPU
profile does, at about three times the profiler's overhead per call (each reading is a system
call). One profile at a time: a second request while one runs gets 409.
Go's heap, goroutine and trace profiles have no counterpart here. The path sits behind the
metrics port's auth, and ``--enable-debug-endpoints=false`` removes it with the other views.
"""

from __future__ import annotations

import asyncio
import cProfile
import html
import io
import marshal
import pstats
import sys
import time
from collections.abc import Callable
from typing import Final

from aiohttp import web

DEFAULT_SECONDS: Final = 30
MAX_SECONDS: Final = 300
TEXT_ROWS: Final = 60
CLOCKS: Final[dict[str, Callable[[], float] | None]] = {"wall": None, "cpu": time.thread_time}
"""``clock`` → the profiler's timer (``None``: cProfile's own, the wall clock)."""

PROFILES: Final = (
    ("cmdline", "The command line invocation of the current program"),
    (
        "profile",
        "CPU profile of the event loop (every request, plugin and background task). You can "
        "specify the duration in the seconds GET parameter (default 30). After you get the "
        "profile file, open it with python -m pstats or snakeviz; format=text answers with the "
        "top functions by cumulative time instead; clock=cpu counts the loop thread's CPU time "
        "instead of the wall clock.",
    ),
)
"""The profiles served here, each with its description (the index lists them in this order)."""
NOT_SERVED: Final = ("allocs", "block", "goroutine", "heap", "mutex", "threadcreate", "trace")
"""Go's runtime profiles with no counterpart here (the index says so)."""


async def index(_: web.Request) -> web.Response:
    """Go's ``/debug/pprof/`` index: the profiles served, linked, and what each is."""
    rows = "".join(f"<tr><td>0</td><td><a href='{n}'>{n}</a></td></tr>\n" for n, _ in PROFILES)
    descriptions = "".join(
        f"<li><div class=profile-name>{n}: </div> {html.escape(d)}</li>\n" for n, d in PROFILES
    )
    page = (
        "<html>\n<head>\n<title>/debug/pprof/</title>\n</head>\n<body>\n/debug/pprof/\n<br>\n"
        "<br>\nTypes of profiles available:\n<table>\n"
        f"<thead><td>Count</td><td>Profile</td></thead>\n{rows}</table>\n"
        f"<br>\n<p>\nProfile Descriptions:\n<ul>\n{descriptions}</ul>\n</p>\n"
        f"<p>Not served (Go runtime profiles): {', '.join(NOT_SERVED)}.</p>\n</body>\n</html>\n"
    )
    return web.Response(text=page, content_type="text/html")


async def cmdline(_: web.Request) -> web.Response:
    """The process's command line, NUL-separated (Go's ``/debug/pprof/cmdline``)."""
    return web.Response(text="\x00".join(sys.orig_argv), content_type="text/plain")


async def to_index(_: web.Request) -> web.Response:
    raise web.HTTPMovedPermanently("/debug/pprof/")


class Profiler:
    def __init__(self) -> None:
        self._busy = False

    async def profile(self, request: web.Request) -> web.Response:
        try:
            seconds = int(request.query.get("seconds", str(DEFAULT_SECONDS)))
        except ValueError:
            return web.Response(status=400, text="seconds must be an integer\n")
        if not 1 <= seconds <= MAX_SECONDS:
            return web.Response(status=400, text=f"seconds must be 1..{MAX_SECONDS}\n")
        clock = request.query.get("clock", "wall")
        if clock not in CLOCKS:
            return web.Response(status=400, text=f"clock must be one of {', '.join(CLOCKS)}\n")
        if self._busy:
            return web.Response(status=409, text="a profile is already being taken\n")
        self._busy = True
        timer = CLOCKS[clock]
        profiler = cProfile.Profile() if timer is None else cProfile.Profile(timer)
        try:
            profiler.enable()
            try:
                await asyncio.sleep(seconds)
            finally:
                profiler.disable()
        finally:
            self._busy = False
        if request.query.get("format") == "text":
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(TEXT_ROWS)
            return web.Response(text=out.getvalue())
        profiler.create_stats()
        body = marshal.dumps(profiler.stats)
        return web.Response(
            body=body,
            content_type="application/octet-stream",
            headers={"Content-Disposition": 'attachment; filename="profile.pstats"'},
        )
